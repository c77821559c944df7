"""Where sandboxes live on the host: slot directories and leased uids.

Every sandbox, whatever its backend, holds a *slot*: a directory under the runtime
dir and an exclusive lock on ``slot-N.lock``. The lock dies with its process, so a slot
directory whose lock nobody holds belongs to a process that died and may be swept.
When the host process is root, agent code runs as a leased uid of its own, so the
process limit (``RLIMIT_NPROC``, counted per uid) is per sandbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from bat_gym.errors import SandboxUnavailable

__all__ = ["SANDBOX_UID_BASE", "Slot", "UidLease", "runtime_dir", "sweep_stale"]

SANDBOX_UID_BASE = int(os.environ.get("BAT_GYM_SANDBOX_UID", "62000"))
_SLOTS = 512


def runtime_dir() -> Path:
    """Where sandboxes keep their workspaces and locks (``BAT_GYM_RUNTIME_DIR`` overrides)."""
    root = Path(
        os.environ.get("BAT_GYM_RUNTIME_DIR")
        or Path(tempfile.gettempdir()) / f"bat_gym-{os.getuid()}"
    )
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root


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
        busy = set()
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    busy.add(os.stat(f"/proc/{name}").st_uid)
        self.uid, self.fd = -1, -1
        for uid in range(SANDBOX_UID_BASE, SANDBOX_UID_BASE + _SLOTS):
            if uid not in busy and (fd := _lock(leases / f"uid-{uid}.lock")) >= 0:
                self.uid, self.fd = uid, fd
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
        for i in range(_SLOTS):
            fd = _lock(rt / f"slot-{i}.lock")
            if fd >= 0:
                self.index, self.fd = i, fd
                break
        else:
            raise SandboxUnavailable(backend, f"all {_SLOTS} sandbox slots under {rt} are in use")
        self.dir = rt / f"slot-{self.index}"
        if self.dir.exists():  # left by a process that died: its lock is ours now
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(mode=0o711)

    def release(self) -> None:
        """Delete the slot directory and unlock it (idempotent)."""
        if self.fd >= 0:
            shutil.rmtree(self.dir, ignore_errors=True)
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
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        finally:
            os.close(fd)
    return removed
