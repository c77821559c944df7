"""What a restored directory carries besides its entries: mode, owner, xattrs, inode flags.

A snapshot records each directory's mode bits and nothing else about it, and nothing
at all about the workspace root. Agent code owns every directory of its workspace, the
root included, so without a capability it can still

* ``chmod`` it (``000`` or ``555`` on the root: the next episode cannot write);
* set extended attributes: ``user.*`` (a message to the next episode) and POSIX ACLs
  (``system.posix_acl_*``; a default ACL shapes every file later made under it);
* ``chattr`` the flags an owner may set (``+A`` no-atime, ``+d`` no-dump, ...;
  ``+i`` and ``+a`` need ``CAP_LINUX_IMMUTABLE``, which it does not hold).

A restore puts every directory it keeps, and the root, back to the state a fresh
directory has: :class:`DirBaseline` is that state, read from the root when the index
is made, and :func:`normalize_dir` applies it. Regular files need none of this: each of
these changes moves a file's ``ctime``, which no user-space call can set back, so a file
touched since the last restore is rewritten whole.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from dataclasses import dataclass

__all__ = ["DirBaseline", "normalize_dir"]

# _IOR('f', 1, long) and _IOW('f', 2, long); the kernel reads and writes an int there.
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FLAGS_BUF = 8
# Inode flags chattr sets (FS_*_FL): secrm, unrm, compr, sync, immutable, append, nodump,
# noatime, nocomp, journal-data, notail, dirsync, topdir, nocow, projinherit. Flags the
# file system keeps for itself (ext4's extents, say) are left as they are.
_CHATTR_FLAGS = 0x000000FF | 0x400 | 0x4000 | 0x8000 | 0x10000 | 0x20000 | 0x800000 | 0x20000000
# No attribute file system or no flags ioctl: nothing of the kind to undo there.
_UNSUPPORTED = (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
# Labels of a security module are set by the kernel's policy, not by the agent.
_KEPT_XATTR_PREFIX = "security."


def _get_flags(fd: int) -> int | None:
    """The inode flags of ``fd`` (``lsattr``), or None where the file system has none."""
    try:
        raw = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(_FLAGS_BUF))
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise
    return struct.unpack_from("i", raw)[0]


def _set_flags(fd: int, flags: int) -> None:
    fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags).ljust(_FLAGS_BUF, b"\0"))


@dataclass(frozen=True)
class DirBaseline:
    """The state of a fresh workspace directory, which a restore returns each one to.

    Attributes:
        root_mode: permission bits of the workspace root (``0o755`` for a sandbox's).
        owner: ``(uid, gid)`` every directory must have, or None to leave owners alone
            (an unprivileged host: agent code cannot give a file away there).
        flags: the root's chattr flags when it was fresh, or None where the file system
            has none.
    """

    root_mode: int
    owner: tuple[int, int] | None
    flags: int | None

    @classmethod
    def of_root(cls, fd: int, owner: tuple[int, int] | None) -> DirBaseline:
        """Read the baseline from the fresh workspace root open at ``fd``."""
        st = os.fstat(fd)
        return cls(stat.S_IMODE(st.st_mode), owner, _get_flags(fd))


def normalize_dir(fd: int, st: os.stat_result, baseline: DirBaseline) -> bool:
    """Give the directory open at ``fd`` the baseline's owner, flags and no xattrs.

    Mode bits are the caller's: it sets them once the directory's children are in
    place, since a read-only directory would block their restore.

    Args:
        fd: the directory, opened without following links.
        st: its ``lstat`` result from before this call.
        baseline: what a fresh directory carries.

    Returns:
        Whether anything had to change.
    """
    changed = False
    if baseline.flags is not None:
        flags = _get_flags(fd)
        if flags is not None and flags & _CHATTR_FLAGS != baseline.flags & _CHATTR_FLAGS:
            _set_flags(fd, flags & ~_CHATTR_FLAGS | baseline.flags & _CHATTR_FLAGS)
            changed = True
    if baseline.owner is not None and (st.st_uid, st.st_gid) != baseline.owner:
        os.fchown(fd, *baseline.owner)
        changed = True
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        names = []
    for name in names:
        if not name.startswith(_KEPT_XATTR_PREFIX):
            try:
                os.removexattr(fd, name)
            except OSError as exc:
                if exc.errno != errno.ENODATA:  # gone meanwhile is fine
                    raise
            changed = True
    return changed
