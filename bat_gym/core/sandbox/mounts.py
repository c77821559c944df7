"""A size-capped tmpfs for each workspace, where the host may mount one.

The workspace quota is checked after every call by a scan (apparent size, file
count), but within one call agent code could still write many files of up to
``RLIMIT_FSIZE`` each to the host's disk. A tmpfs mounted on the workspace with
``size=`` and ``nr_inodes=`` makes the kernel refuse the write that would pass the
quota (``ENOSPC`` inside the sandbox), and its pages are charged to the memory cgroup
of the process that writes them: the agent's. Mounting needs ``CAP_SYS_ADMIN`` in the
host's mount namespace (a root host); elsewhere the workspace stays a directory and
only the scan enforces the quota.
"""

from __future__ import annotations

import os
from pathlib import Path

from bat_gym.core.sandbox.libc import libc

__all__ = ["mount_tmpfs", "unmount_under"]

_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH = 0x2


def mount_tmpfs(path: Path, *, size_bytes: int, inodes: int, mode: int = 0o755) -> bool:
    """Mount a tmpfs of ``size_bytes`` and ``inodes`` on the directory ``path``.

    ``nosuid`` and ``nodev``: nothing on it can gain privileges. Returns False, and
    leaves ``path`` as it was, where this process may not mount.
    """
    if os.geteuid() != 0:
        return False
    opts = f"size={size_bytes},nr_inodes={inodes},mode={mode:o}".encode()
    rc = libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts)
    return rc == 0


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def unmount_under(path: Path) -> int:
    """Detach every mount at or below ``path``, deepest first; return how many.

    Used before a slot directory is removed: a tmpfs left by a process that died
    would otherwise make the directory impossible to delete.
    """
    root = os.path.realpath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return 0
    points = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = _unescape(fields[4])
            if point == root or point.startswith(root + "/"):
                points.append(point)
    done = 0
    for point in sorted(points, key=len, reverse=True):
        if libc().umount2(os.fsencode(point), _MNT_DETACH) == 0:
            done += 1
    return done
