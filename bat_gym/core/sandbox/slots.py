"""Where sandboxes live on the host: slot directories and leased uids.

Every sandbox, whatever its backend, holds a *slot*: a directory under the runtime
dir and an exclusive lock on ``slot-N.lock``. The lock dies with its process, so a slot
directory whose lock nobody holds belongs to a process that died and may be swept.
When the host process is root, agent code runs as a leased uid of its own, so the
process limit (``RLIMIT_NPROC``, counted per uid) is per sandbox.

Agent code shapes what is inside a slot directory (any depth, locked directories), so
removal is iterative (:func:`~bat_gym.core.sandbox.trees.remove_path`); a directory that
still cannot be removed is moved aside into ``quarantine/`` and never handed to
another sandbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import SandboxUnavailable
from bat_gym.core.sandbox.mounts import mount_tmpfs, unmount_under
from bat_gym.core.sandbox.trees import remove_path
from bat_gym.core.sandbox.workspace_index import WorkspaceIndex

if TYPE_CHECKING:
    from bat_gym.core.sandbox.base import SandboxLimits

__all__ = ["SANDBOX_UID_BASE", "Slot", "UidLease", "runtime_dir", "sweep_stale", "discard_dir"]

log = logging.getLogger(__name__)

SANDBOX_UID_BASE = int(os.environ.get("BAT_GYM_SANDBOX_UID", "62000"))
# Sandboxes per host at once (slot directories, and uids for root-run sandboxes:
# 62000-64047 by default, below nobody's 65534). A thousand envs per node need room.
_SLOTS = 2048


def runtime_dir() -> Path:
    """Where sandboxes keep their workspaces and locks (``BAT_GYM_RUNTIME_DIR`` overrides)."""
    root = Path(
        os.environ.get("BAT_GYM_RUNTIME_DIR")
        or Path(tempfile.gettempdir()) / f"bat_gym-{os.getuid()}"
    )
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root


def discard_dir(path: Path) -> bool:
    """Remove ``path`` and all under it; if that fails, move it into quarantine.

    Returns:
        True once nothing is left at ``path`` (removed or quarantined). Never raises
        for what is inside the tree.
    """
    try:
        if os.geteuid() == 0:
            unmount_under(path)  # a workspace tmpfs left by a process that died
        remove_path(path)
        return True
    except (OSError, RecursionError) as exc:
        reason = exc
    quarantine = path.parent / "quarantine"
    try:
        quarantine.mkdir(mode=0o700, exist_ok=True)
        os.rename(path, quarantine / f"{path.name}-{uuid.uuid4().hex[:12]}")
    except OSError as exc:
        log.warning("cannot remove or quarantine %s (%s; %s)", path, reason, exc)
        return False
    log.warning("quarantined %s, which could not be removed: %s", path, reason)
    return True


# Where this process's next search for a free slot or uid starts: just after the last
# one it took. From 0 every time, the thousandth sandbox would first try 999 held locks.
_cursor = {"slot": 0, "uid": 0}
_cursor_lock = threading.Lock()
_BUSY_TTL_S = 1.0  # how long the list of uids other processes run as is reused
_busy: dict[str, Any] = {"at": -_BUSY_TTL_S, "uids": frozenset()}


def _fresh_lock_in_child() -> None:
    # Another thread may have held it at the fork; the child has no such thread.
    global _cursor_lock
    _cursor_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def _search(kind: str) -> list[int]:
    """Indices ``0 .. _SLOTS - 1`` from this process's cursor for ``kind``, wrapping."""
    with _cursor_lock:
        start = _cursor[kind]
    return [(start + i) % _SLOTS for i in range(_SLOTS)]


def _took(kind: str, index: int) -> None:
    with _cursor_lock:
        _cursor[kind] = (index + 1) % _SLOTS


def _busy_uids() -> frozenset[int]:
    """Uids that processes on this host run as (read at most once a second).

    Listing every process costs milliseconds with a thousand sandboxes running; a
    list a second old can only miss a program that started since, which the uid's
    lock file does not guard against either way.
    """
    with _cursor_lock:
        if time.monotonic() - _busy["at"] < _BUSY_TTL_S:
            return _busy["uids"]
    busy = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                busy.add(os.stat(f"/proc/{name}").st_uid)
    with _cursor_lock:
        _busy["at"], _busy["uids"] = time.monotonic(), frozenset(busy)
    return _busy["uids"]


def _lock(path: Path) -> int:
    """Open and exclusively lock ``path``; return the fd, or -1 if someone holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    return fd


class UidLease:
    """A uid for a root-run sandbox, held by a lock shared by every runtime dir.

    Uids that any process runs as are skipped: some other program (another
    container, say) uses them, and would share the sandbox's process limit.
    """

    def __init__(self, backend: str) -> None:
        leases = Path(tempfile.gettempdir()) / "bat_gym-uids"
        leases.mkdir(mode=0o700, exist_ok=True)
        busy = _busy_uids()
        self.uid, self.fd = -1, -1
        for i in _search("uid"):
            uid = SANDBOX_UID_BASE + i
            if uid not in busy and (fd := _lock(leases / f"uid-{uid}.lock")) >= 0:
                self.uid, self.fd = uid, fd
                _took("uid", i)
                return
        raise SandboxUnavailable(backend, f"no free sandbox uid from {SANDBOX_UID_BASE} on")

    def release(self) -> None:
        """Give the uid back (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Slot:
    """A locked directory under the runtime dir; a lock nobody holds marks it stale."""

    def __init__(self, rt: Path, backend: str) -> None:
        self.index = -1
        self.fd = -1
        for i in _search("slot"):
            fd = _lock(rt / f"slot-{i}.lock")
            if fd >= 0:
                self.index, self.fd = i, fd
                _took("slot", i)
                break
        else:
            raise SandboxUnavailable(backend, f"all {_SLOTS} sandbox slots under {rt} are in use")
        self.dir = rt / f"slot-{self.index}"
        # Left by a process that died: its lock is ours now.
        if os.path.lexists(self.dir) and not discard_dir(self.dir):
            os.close(self.fd)
            self.fd = -1
            raise SandboxUnavailable(
                backend, f"{self.dir} was left by a dead process and cannot be removed"
            )
        self.dir.mkdir(mode=0o711)

    def make_workspace(
        self, *, size_mb: int, files: int, owner: tuple[int, int] | None
    ) -> tuple[Path, bool]:
        """Create ``workspace/`` in the slot, on a capped tmpfs where one can be mounted.

        Args:
            size_mb: the workspace quota in MiB (the tmpfs size).
            files: the file quota; the tmpfs gets a few inodes more, so the scan, not
                ``ENOSPC``, is what reports a workspace that reached it.
            owner: ``(uid, gid)`` of the workspace root, or None for the caller's.

        Returns:
            The path, and whether the kernel enforces the quota (a tmpfs).
        """
        ws = self.dir / "workspace"
        ws.mkdir(mode=0o755)
        capped = mount_tmpfs(ws, size_bytes=size_mb << 20, inodes=files + 64)
        if owner is not None:
            os.chown(ws, *owner)
        return ws, capped

    def open_workspace(
        self, limits: SandboxLimits, owner: tuple[int, int] | None
    ) -> tuple[Path, bool, WorkspaceIndex]:
        """:meth:`make_workspace` with ``limits``' quota, and the index that watches it.

        Returns:
            The path, whether the kernel enforces the quota, and the workspace's index
            (with a change watch, bounded by ``limits.workspace_limits()``).
        """
        ws, capped = self.make_workspace(
            size_mb=limits.workspace_mb, files=limits.workspace_files, owner=owner
        )
        index = WorkspaceIndex(ws, owner=owner, watch=True, limits=limits.workspace_limits())
        return ws, capped, index

    def release(self) -> None:
        """Delete the slot directory and unlock it (idempotent)."""
        if self.fd >= 0:
            discard_dir(self.dir)
            os.close(self.fd)
            self.fd = -1


def sweep_stale() -> int:
    """Remove slot directories whose owner died; return how many were removed."""
    rt = runtime_dir()
    removed = 0
    for lock in rt.glob("slot-*.lock"):
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            d = lock.with_suffix("")
            if os.path.lexists(d) and discard_dir(d):
                removed += 1
        finally:
            os.close(fd)
    return removed
