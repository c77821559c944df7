"""Tell, in one syscall, whether anything in a workspace may have changed.

An inotify watch on every directory of the workspace records creations, deletions,
renames, writes, attribute changes and closes of files opened for writing. Writes
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
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_ONLYDIR = 0x400, 0x800, 0x01000000
_IN_IGNORED = 0x8000  # the kernel dropped a watch: its directory is gone
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)



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
        self._watched: set[int] = set()

    def add(self, dir_fd: int) -> None:
        """Watch the directory open at ``dir_fd`` (idempotent)."""
        if self.overflowed:
            return
        # Through /proc/self/fd the watch lands on exactly this directory, whatever
        # symlinks the sandbox has put in its path since it was opened.
        path = f"/proc/self/fd/{dir_fd}".encode()
        wd = libc().inotify_add_watch(self.fd, path, _MASK)
        if wd < 0:
            self.dirty = True
            return
        self._watched.add(wd)
        if len(self._watched) > self.max_watches:
            self._overflow()

    def _overflow(self) -> None:
        os.close(self.fd)  # gives every watch of this instance back at once
        self.fd = -1
        self._watched.clear()
        self.overflowed = self.dirty = True

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
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        if data:
            self.dirty = True
            self._forget_dropped(data)
        return self.dirty

    def _forget_dropped(self, data: bytes) -> None:
        """Take the watches the kernel dropped (``IN_IGNORED``) off the count."""
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, pos)
            if mask & _IN_IGNORED:
                self._watched.discard(wd)
            pos += _EVENT.size + length

    def clear(self) -> None:
        """Forget pending events and failed watches; call right before a full walk.

        Events raised during the walk then stay pending, so the next check sees them.
        """
        self.drop_events()
        self.dirty = self.overflowed

    def drop_events(self) -> None:
        """Forget pending events but not failed watches (after the caller's own writes)."""
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            self._forget_dropped(data)

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
