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
"""

from __future__ import annotations

import ctypes
import os
import struct

from bat_gym.sandbox.libc import libc

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
        self.fd = _inotify()
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
        if self.overflowed:
            return
        # Through /proc/self/fd the watch lands on exactly this directory, whatever
        # symlinks the sandbox has put in its path since it was opened.
        proc = f"/proc/self/fd/{dir_fd}".encode()
        wd = libc().inotify_add_watch(self.fd, proc, _MASK)
        if wd < 0:
            self.dirty = True
            return
        self._watched[wd] = path + "/" if path else ""
        if len(self._watched) > self.max_watches:
            self._overflow()

    def _overflow(self) -> None:
        os.close(self.fd)  # gives every watch of this instance back at once
        self.fd = -1
        self._watched.clear()
        self.overflowed = self.dirty = self.reads_lost = True

    def reset(self) -> None:
        """Drop every watch and event, and start over with none (lifts an overflow).

        Not dirty afterwards: the caller adds a watch for every directory it then
        writes. Closing an inotify instance that holds watches costs milliseconds, so
        call it only after an overflow.
        """
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = _inotify()
        self._watched.clear()
        self.overflowed = self.dirty = False

    @property
    def watches(self) -> int:
        """Directories watched now."""
        return len(self._watched)

    def changed(self) -> bool:
        """True if anything happened since the last :meth:`clear`."""
        if self.dirty or self.overflowed:
            return True
        self._drain()
        return self.dirty

    def _drain(self) -> None:
        """Read and parse every pending event."""
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        """Note changes (dirty), reads, and watches the kernel dropped (``IN_IGNORED``)."""
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, pos)
            if mask & _IN_IGNORED:
                self._watched.pop(wd, None)
            if mask & (_CHANGES | _IN_IGNORED | _IN_Q_OVERFLOW):
                self.dirty = True
            if mask & _IN_Q_OVERFLOW:
                self.reads_lost = True
            elif mask & _IN_CLOSE_NOWRITE and not mask & _IN_ISDIR and length:
                name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                directory = self._watched.get(wd)
                if directory is None:
                    pass
                elif len(self._reads) >= _MAX_READS:
                    self.reads_lost = True
                else:
                    self._reads.add(directory + name.decode(errors="replace"))
            pos += _EVENT.size + length

    def take_reads(self) -> frozenset[str] | None:
        """Files closed without writing since the last take, or None if some were lost.

        Paths are relative to the tree's root. A file in a directory no scan has seen
        yet (made since the last scan) is not watched, so not reported.
        """
        self._drain()
        reads, self._reads = frozenset(self._reads), set()
        lost, self.reads_lost = self.reads_lost or self.overflowed, False
        return None if lost else reads

    def clear(self) -> None:
        """Forget pending events and failed watches; call right before a full walk.

        Events raised during the walk then stay pending, so the next check sees them.
        """
        self.drop_events()
        self.dirty = self.overflowed

    def drop_events(self) -> None:
        """Forget pending events but not failed watches (after the caller's own writes)."""
        self._drain()

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
