"""Tell, in one syscall, whether anything in a workspace may have changed.

An inotify watch on every directory of the workspace records creations, deletions,
renames, writes, attribute changes and closes of files opened for writing. It also
records which files were closed without writing (:meth:`ChangeWatch.take_reads`):
the files a tool call read, for its execution record; those events change nothing. Writes
through a shared memory mapping raise no event of their own, but the file must have
been opened for writing, and its close (at the latest when the writing process exits)
raises one. Only a process that keeps such a file open across calls can change it
unseen; the verifier rescans from scratch and is not affected.

Watches are a budget of the user, shared by every process on the host
(``fs.inotify.max_user_watches``), and agent code decides how many directories there
are. A watch holds at most ``max_watches`` of them: past that it gives every watch
back and answers "changed" until :meth:`ChangeWatch.reset`, so the caller scans instead.

Instances are a much smaller budget (``fs.inotify.max_user_instances``, 128 by default):
one per env would stop a process at about a hundred envs. So every watch of a process
shares one instance (:class:`_Inotify`), whose events are routed to their watch by the
watch descriptor. Whichever watch reads the queue hands every other watch its events.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

from bat_gym.core.sandbox.libc import libc

__all__ = ["ChangeWatch"]

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE, _IN_CLOSE_NOWRITE = 0x2, 0x4, 0x8, 0x10
_IN_Q_OVERFLOW, _IN_ISDIR = 0x4000, 0x40000000
_MAX_READS = 10_000  # distinct files a read record holds before it gives up
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_ONLYDIR = 0x400, 0x800, 0x01000000
_IN_IGNORED = 0x8000  # the kernel dropped a watch: its directory is gone
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
# Events that mean the tree may differ; a read-only close (the read record) does not.
_CHANGES = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_MASK = _CHANGES | _IN_CLOSE_NOWRITE | _IN_ONLYDIR


def _inotify() -> int:
    fd = libc().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


class _Inotify:
    """The process's one inotify instance, shared by every :class:`ChangeWatch`.

    A watch descriptor belongs to one watch (``owners``); events are parsed here and
    handed to their owner. Two watches never share a directory (each watches its own
    tree); if one asks for a directory another already watches, the add fails for it.
    A child process made by ``fork`` gets an instance of its own on first use: the
    watches it inherited are then void (``generation`` moves on).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.fd = -1
        self.pid = -1
        self.generation = 0
        self.owners: dict[int, ChangeWatch] = {}

    def _open(self) -> int:
        if self.fd < 0 or self.pid != os.getpid():
            fd = _inotify()  # raises first: a failure leaves the old state as it was
            self.fd, self.pid = fd, os.getpid()
            self.generation += 1
            self.owners = {}
        return self.fd

    def add(self, owner: ChangeWatch, path: bytes) -> int:
        """A new watch descriptor of ``owner`` on ``path``, or -1 if it cannot have one."""
        with self.lock:
            wd = libc().inotify_add_watch(self._open(), path, _MASK)
            if wd < 0:
                return -1
            holder = self.owners.get(wd)
            if holder is not None and holder is not owner:
                return -1  # another tree's directory: its events are not ours
            self.owners[wd] = owner
            return wd

    def remove(self, owner: ChangeWatch, wds: list[int]) -> None:
        """Give ``owner``'s watch descriptors ``wds`` back to the kernel."""
        with self.lock:
            if self.pid != os.getpid():
                return
            for wd in wds:
                if self.owners.get(wd) is owner:
                    del self.owners[wd]
                    libc().inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        """Read every pending event and hand each to the watch it belongs to."""
        with self.lock:
            while self.fd >= 0 and self.pid == os.getpid():
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, pos)
            name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
            pos += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:  # events of every watch were dropped
                for owner in set(self.owners.values()):
                    owner.dirty = owner.reads_lost = True
                continue
            owner = self.owners.get(wd)
            if owner is None:
                continue  # a descriptor already given back
            if mask & _IN_IGNORED:
                del self.owners[wd]
            owner._event(wd, mask, name)


_INOTIFY = _Inotify()


def _after_fork_in_child() -> None:
    """A child made by ``fork`` starts with a lock no thread holds and no instance.

    A thread of the parent may hold the lock at the fork (a sandbox closed by the
    garbage collector on another thread gives its watches back under it); the child
    has no such thread, so the lock would stay held forever. The parent's instance and
    its watches are the parent's: the child's inherited watches are void (``generation``).
    """
    _INOTIFY.lock = threading.RLock()
    if _INOTIFY.fd >= 0:
        os.close(_INOTIFY.fd)
    _INOTIFY.fd, _INOTIFY.pid, _INOTIFY.owners = -1, -1, {}
    _INOTIFY.generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class ChangeWatch:
    """An inotify instance over the directories of one tree.

    Args:
        max_watches: directories watched at most (see the module docstring).

    Raises:
        OSError: inotify is unavailable (callers fall back to scanning every time).
    """

    def __init__(self, max_watches: int = 2048) -> None:
        if max_watches < 1:
            raise ValueError(f"max_watches must be at least 1, got {max_watches}")
        self.max_watches = max_watches
        with _INOTIFY.lock:
            _INOTIFY._open()  # raises OSError where inotify is unavailable
            self._generation = _INOTIFY.generation
        self.closed = False
        self.dirty = True
        """Set when events (or a failed watch) mean the tree must be rescanned."""
        self.overflowed = False
        """Set when the tree outgrew ``max_watches``: every check says "changed"."""
        self._watched: dict[int, str] = {}  # wd -> directory, "" or ending in "/"
        self._reads: set[str] = set()
        self.reads_lost = False
        """Set when read events were lost (queue overflow, watch overflow) since the last take."""

    def add(self, dir_fd: int, path: str = "") -> None:
        """Watch the directory open at ``dir_fd``, ``path`` in the tree (idempotent)."""
        if self.overflowed or self.closed or not self._current():
            return
        # Through /proc/self/fd the watch lands on exactly this directory, whatever
        # symlinks the sandbox has put in its path since it was opened.
        proc = f"/proc/self/fd/{dir_fd}".encode()
        wd = _INOTIFY.add(self, proc)
        if wd < 0:
            # Unwatched, so neither its changes nor its reads would be seen.
            self.dirty = self.reads_lost = True
            return
        self._watched[wd] = path + "/" if path else ""
        if len(self._watched) > self.max_watches:
            self._overflow()

    def _current(self) -> bool:
        """False (and overflowed) once a fork left this watch's descriptors behind."""
        if self._generation == _INOTIFY.generation and _INOTIFY.pid == os.getpid():
            return True
        if not self.overflowed:
            self._watched.clear()
            self.overflowed = self.dirty = self.reads_lost = True
        return False

    def _give_back(self) -> None:
        _INOTIFY.remove(self, list(self._watched))
        self._watched.clear()

    def _overflow(self) -> None:
        self._give_back()
        self.overflowed = self.dirty = self.reads_lost = True

    def reset(self) -> None:
        """Drop every watch and event, and start over with none (lifts an overflow).

        Not dirty afterwards: the caller adds a watch for every directory it then
        writes. Giving back many watches costs milliseconds, so call it only after an
        overflow.
        """
        with _INOTIFY.lock:
            _INOTIFY.drain()  # events of the old watches go to this watch, then ...
            self._give_back()
            _INOTIFY._open()
            self._generation = _INOTIFY.generation
            self._reads.clear()
            self.overflowed = self.dirty = False  # ... are forgotten

    @property
    def watches(self) -> int:
        """Directories watched now."""
        return len(self._watched)

    def changed(self) -> bool:
        """True if anything happened since the last :meth:`clear`."""
        if self.dirty or self.overflowed or not self._current():
            return True
        _INOTIFY.drain()
        return self.dirty

    def _event(self, wd: int, mask: int, name: bytes) -> None:
        """One event of this watch: a change (dirty), a read, or a dropped watch."""
        if mask & _IN_IGNORED:
            self._watched.pop(wd, None)
        if mask & (_CHANGES | _IN_IGNORED):
            self.dirty = True
        elif mask & _IN_CLOSE_NOWRITE and not mask & _IN_ISDIR and name:
            directory = self._watched.get(wd)
            if directory is None:
                pass
            elif len(self._reads) >= _MAX_READS:
                self.reads_lost = True
            else:
                self._reads.add(directory + name.decode(errors="replace"))

    def take_reads(self) -> frozenset[str] | None:
        """Files closed without writing since the last take, or None if some were lost.

        Paths are relative to the tree's root. A file in a directory no scan has seen
        yet (made since the last scan) is not watched, so not reported.
        """
        self._current()
        with _INOTIFY.lock:
            _INOTIFY.drain()
            reads, self._reads = frozenset(self._reads), set()
            lost, self.reads_lost = self.reads_lost or self.overflowed, False
        return None if lost else reads

    def clear(self) -> None:
        """Forget pending events and failed watches; call right before a full walk.

        Events raised during the walk then stay pending, so the next check sees them.
        """
        with _INOTIFY.lock:  # no other watch's drain may slip an event in between
            _INOTIFY.drain()
            self.dirty = self.overflowed or not self._current()

    def drop_events(self) -> None:
        """Forget pending events but not failed watches (after the caller's own writes)."""
        _INOTIFY.drain()

    def close(self) -> None:
        """Give every watch back (idempotent)."""
        if not self.closed:
            self.closed = True
            self._give_back()
