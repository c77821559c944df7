"""A process's temporary folders: removed when it exits, or by a later process after a kill.

A process killed by a signal (a build stopped with SIGKILL, a worker past its deadline)
runs no exit handler, so what it kept under the system temp dir would stay there for
good. So each process keeps its folders under one root of its own, whose ``.owner``
file it holds locked (``flock``) while it lives. The kernel drops the lock when the
process dies, however it dies: the next process to make a root removes every root
whose lock it can take, and never one whose owner lives. Pids would not do: processes
in other pid namespaces may share the temp dir.
"""

from __future__ import annotations

import fcntl
import glob
import multiprocessing.util
import os
import shutil
import stat
import tempfile
import threading

__all__ = ["scratch_dir", "sweep"]

_PREFIX = "bat-gym-scratch-"
_OWNER = ".owner"
_lock = threading.Lock()
_mine: dict[str, int | str] = {}  # this process's root: pid, folder, and the fd of its lock


def scratch_dir(prefix: str) -> str:
    """A new, empty folder of this process, deleted (with all in it) when it exits.

    Args:
        prefix: the start of the folder's name (``"reproduce-"``).
    """
    return tempfile.mkdtemp(prefix=prefix, dir=_root())


def sweep() -> list[str]:
    """Remove the roots of processes that died without removing them; return their paths.

    Only folders of this user, with an ``.owner`` file nobody holds locked.
    """
    removed = []
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{_PREFIX}*")):
        try:
            st = os.lstat(folder)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(folder, _OWNER), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # its owner lives
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        removed.append(folder)
    return removed


def _root() -> str:
    """This process's root, made (after a sweep) on first use."""
    with _lock:
        if _mine.get("pid") != os.getpid():
            sweep()
            folder = tempfile.mkdtemp(prefix=_PREFIX)
            # Locked before it takes its name, so a sweep never finds it unlocked.
            fd, path = tempfile.mkstemp(dir=folder)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(path, os.path.join(folder, _OWNER))
            _mine.update(pid=os.getpid(), folder=folder, fd=fd)
            # Multiprocessing's exit finalizers run where atexit does not (a pool worker
            # leaves through os._exit); a child drops the ones it inherits.
            multiprocessing.util.Finalize(None, _remove_root, exitpriority=0)
        return str(_mine["folder"])


def _remove_root() -> None:
    if _mine.get("pid") == os.getpid():
        shutil.rmtree(str(_mine["folder"]), ignore_errors=True)
        os.close(int(_mine["fd"]))
        _mine.clear()


def _forget_after_fork() -> None:
    """In a forked child: the root is the parent's; let go of the parent's lock on it."""
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    fd = _mine.get("fd")
    _mine.clear()
    if fd is not None:
        os.close(int(fd))


os.register_at_fork(after_in_child=_forget_after_fork)
