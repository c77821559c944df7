"""Tell, in one syscall, whether anything in a workspace may have changed.

An inotify watch on every directory of the workspace records creations, deletions,
renames, writes, attribute changes and closes of files opened for writing. Writes
through a shared memory mapping raise no event of their own, but the file must have
been opened for writing, and its close (at the latest when the writing process exits)
raises one. Only a process that keeps such a file open across calls can change it
unseen; the verifier rescans from scratch and is not affected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["ChangeWatch"]

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_ONLYDIR = 0x400, 0x800, 0x01000000
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

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


class ChangeWatch:
    """An inotify instance over the directories of one tree.

    Raises:
        OSError: inotify is unavailable (callers fall back to scanning every time).
    """

    def __init__(self) -> None:
        fd = _lib().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd = fd
        self.dirty = True
        """Set when events (or a failed watch) mean the tree must be rescanned."""

    def add(self, dir_fd: int) -> None:
        """Watch the directory open at ``dir_fd`` (idempotent)."""
        # Through /proc/self/fd the watch lands on exactly this directory, whatever
        # symlinks the sandbox has put in its path since it was opened.
        path = f"/proc/self/fd/{dir_fd}".encode()
        if _lib().inotify_add_watch(self.fd, path, _MASK) < 0:
            self.dirty = True

    def changed(self) -> bool:
        """True if anything happened since the last :meth:`clear`."""
        if self.dirty:
            return True
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        if data:
            self.dirty = True
        return self.dirty

    def clear(self) -> None:
        """Forget pending events and failed watches; call right before a full walk.

        Events raised during the walk then stay pending, so the next check sees them.
        """
        self.drop_events()
        self.dirty = False

    def drop_events(self) -> None:
        """Forget pending events but not failed watches (after the caller's own writes)."""
        while True:
            try:
                if not os.read(self.fd, 65536):
                    break
            except BlockingIOError:
                break

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
