"""The host's record of every program a sandbox executes: path, argv, cwd, exit status.

Why seccomp user notification. The record must come from outside the agent's reach
and cost nothing on calls that execute nothing. The alternatives each fail one of
those: ``LD_PRELOAD`` shims and shell hooks run inside the agent's process and can be
bypassed; ``ptrace`` stops every traced process at every fork and exit and is denied
inside the sandbox; process accounting and the proc connector are host-wide, need
root and drop argv; fanotify sees the executed file but not its arguments. A seccomp
filter (:mod:`bat_gym.core.sandbox.exec_filter`) installed by the sandbox's trusted
process, which agent code inherits and cannot remove, stops only ``execve`` and
``execveat``, and hands each to the listener held here: a ``bash: true`` step runs
no program and pays nothing; a step that runs ``python pipeline.py`` pays one round
trip to this process (tens of microseconds) on top of the exec.

What is recorded, per program run (:class:`~bat_gym.core.sandbox.base.ProgramRun`):

* the path and argv the caller passed, read from its memory through
  ``/proc/PID/mem`` while it waits (the host owns the sandbox's user namespace, or
  is root, so it may), and its working directory;
* its exit status, from a pidfd opened while it waits (``PIDFD_GET_INFO`` with
  ``PIDFD_INFO_EXIT``, Linux 6.15 and later; ``None`` before that, or while the
  program still runs, or when a later ``exec`` replaced it).

One limit is inherent to user notification: the kernel reads the path again after
the host lets the call continue, so a second thread of the caller that rewrites the
path in that window runs a program other than the one recorded. The record is a
statement of what was asked for; the verifier's reproduction of the shipped pipeline
(:mod:`bat_gym.rubrics.verifier.reference`) does not depend on it.

Every listener of the process is served by one daemon thread, which never raises:
a notification it cannot read is still answered, so a sandbox never hangs in
``exec``. A call records at most :data:`MAX_RUNS` programs (later ones run,
unrecorded, and are counted) and at most :data:`MAX_ARGV_BYTES` of each argv.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import posixpath
import select
import stat
import struct
import threading
import time
from dataclasses import dataclass, field

from bat_gym.core.sandbox import fdwait
from bat_gym.core.sandbox.base import ProgramRun
from bat_gym.core.sandbox.exec_filter import _table
from bat_gym.core.sandbox.libc import libc

__all__ = [
    "ExecLog",
    "ExecTracer",
    "MAX_ARGV_BYTES",
    "MAX_RUNS",
    "capped_argv",
    "exec_tracer",
    "steal_fd",
]

log = logging.getLogger(__name__)

MAX_RUNS = 256
MAX_ARGV_BYTES = 8192
_MAX_ARGS = 256
_MAX_PATH = 4096

# struct seccomp_notif: id, pid, flags, then struct seccomp_data (nr, arch, ip, args[6]).
_NOTIF = struct.Struct("=QIIiIQ6Q")
_RESP = struct.Struct("=QqiI")  # struct seccomp_notif_resp: id, val, error, flags
_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
_NOTIF_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
_FLAG_CONTINUE = 1
_AT_EMPTY_PATH = 0x1000
_AT_FDCWD = -100

# struct pidfd_info up to exit_code (PIDFD_INFO_SIZE_VER0 = 64 bytes).
_PIDFD_INFO = struct.Struct("=QQ11Ii")
_PIDFD_GET_INFO = 0xC040FF0B  # _IOWR(0xFF, 11, 64 bytes)
_PIDFD_INFO_EXIT = 1 << 3
_SYS_PIDFD_GETFD = 438  # the same number on every architecture since 5.6
_SYS_OPENAT2 = 437
_RESOLVE_IN_ROOT = 0x10


def steal_fd(pid: int, fd: int) -> int:
    """Duplicate descriptor ``fd`` of process ``pid`` into this process (``pidfd_getfd``).

    Needs the right to ptrace ``pid``. Raises ``OSError`` otherwise.
    """
    pidfd = os.pidfd_open(pid)
    try:
        lib = libc()
        lib.syscall.restype = ctypes.c_long
        got = lib.syscall(
            ctypes.c_long(_SYS_PIDFD_GETFD), ctypes.c_long(pidfd), ctypes.c_long(fd), 0
        )
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"pidfd_getfd: {os.strerror(err)}")
        os.set_inheritable(int(got), False)
        return int(got)
    finally:
        os.close(pidfd)


@dataclass
class _Pending:
    """A recorded run whose exit status is not known yet."""

    run: ProgramRun
    pidfd: int  # -1 when none could be opened


@dataclass
class ExecLog:
    """The programs one listener's sandbox has executed since the last :meth:`take`.

    Filled by the tracer's thread; read by the sandbox's owner.
    """

    fd: int
    ignore: frozenset[tuple[str, ...]] = frozenset()
    _runs: list[_Pending] = field(default_factory=list)
    _dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False

    def _add(self, run: ProgramRun, pidfd: int) -> None:
        ours = tuple(run.argv) not in self.ignore
        with self._lock:
            if ours and len(self._runs) < MAX_RUNS:
                self._runs.append(_Pending(run, pidfd))
                return
            if ours:  # past the cap; the sandbox's own programs are never counted
                self._dropped += 1
        if pidfd >= 0:
            os.close(pidfd)

    def _swap(self) -> tuple[list[_Pending], int]:
        with self._lock:
            runs, self._runs = self._runs, []
            dropped, self._dropped = self._dropped, 0
        return runs, dropped

    def take(self) -> tuple[tuple[ProgramRun, ...], int]:
        """The runs recorded since the last take, with exit statuses; and how many were dropped.

        Call it when the programs are over (the call returned and its leftovers were
        stopped): a program still running has no status yet.
        """
        runs, dropped = self._swap()
        out = []
        last_of_pid = {p.run.pid: i for i, p in enumerate(runs)}
        for i, pending in enumerate(runs):
            run = pending.run
            if pending.pidfd >= 0:
                if last_of_pid[run.pid] == i:
                    status = _exit_status(pending.pidfd)
                    run = run.model_copy(update={"exit_code": status})
                else:  # the same process executed another program after this one
                    run = run.model_copy(update={"replaced": True})
                os.close(pending.pidfd)
            out.append(run)
        return tuple(out), dropped

    def discard(self) -> None:
        """Forget what was recorded (the sandbox's own processes, a killed call)."""
        for pending in self._swap()[0]:
            if pending.pidfd >= 0:
                os.close(pending.pidfd)


def _exit_status(pidfd: int) -> int | None:
    """The exit code of an exited process (negative: killed by that signal), else None."""
    buf = bytearray(_PIDFD_INFO.size)
    struct.pack_into("=Q", buf, 0, _PIDFD_INFO_EXIT)
    for _ in range(50):  # the exit is recorded when the parent reaps: a moment after
        try:
            fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf)
        except OSError as exc:
            # ENOTTY, EINVAL: a kernel without PIDFD_GET_INFO or PIDFD_INFO_EXIT.
            if exc.errno != errno.ESRCH:
                return None
        else:
            fields = _PIDFD_INFO.unpack_from(buf)
            if fields[0] & _PIDFD_INFO_EXIT:
                return os.waitstatus_to_exitcode(fields[-1])
        if not fdwait.readable([pidfd], 0):
            return None  # still running
        time.sleep(0.001)
    return None


class ExecTracer:
    """One thread answering the exec notifications of every sandbox of this process."""

    def __init__(self) -> None:
        self._poll = select.epoll()
        self._logs: dict[int, ExecLog] = {}  # listener fd -> its log
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._adding: list[ExecLog] = []
        self._machine_calls: dict[int, str] | None = None
        self._thread = threading.Thread(target=self._serve, name="bat-gym-exec-trace", daemon=True)
        self._thread.start()

    def watch(self, fd: int, ignore: frozenset[tuple[str, ...]] = frozenset()) -> ExecLog:
        """Serve listener ``fd`` (owned from now on) and return its log.

        ``ignore``: argv vectors of the sandbox's own programs, never recorded.
        """
        logbook = ExecLog(fd, frozenset(tuple(capped_argv(a)) for a in ignore))
        with self._lock:
            self._adding.append(logbook)
        os.write(self._wake_w, b"x")
        return logbook

    def close(self, logbook: ExecLog) -> None:
        """Stop serving ``logbook``'s listener and close it; pending execs fail with ENOSYS.

        What it recorded and nobody took is dropped.
        """
        logbook.closed = True
        os.write(self._wake_w, b"x")
        logbook.discard()

    # -- the thread -----------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            try:
                for fd, events in self._poll.poll():
                    if fd == self._wake_r:
                        self._admin()
                    elif (logbook := self._logs.get(fd)) is not None:
                        # A notification waits (IN); or every process of the filter is
                        # gone (HUP): a receive would then block, so never try one.
                        if events & select.EPOLLIN and not logbook.closed:
                            self._answer(logbook)
                        elif events & (select.EPOLLHUP | select.EPOLLERR) or logbook.closed:
                            self._drop(logbook)
            except Exception:  # never let the thread die: every exec would hang
                log.exception("exec tracer: unexpected error")

    def _admin(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            adding, self._adding = self._adding, []
        for logbook in adding:
            if logbook.closed:
                os.close(logbook.fd)
                logbook.fd = -1
            else:
                self._logs[logbook.fd] = logbook
                self._poll.register(logbook.fd, select.EPOLLIN)
        for logbook in [x for x in self._logs.values() if x.closed]:
            self._drop(logbook)

    def _drop(self, logbook: ExecLog) -> None:
        """Stop serving a listener: closed by its owner, or every process of its filter is gone.

        Its runs stay for the owner's next :meth:`ExecLog.take`.
        """
        if logbook.fd < 0:
            return
        self._poll.unregister(logbook.fd)
        del self._logs[logbook.fd]
        os.close(logbook.fd)
        logbook.fd = -1

    def _answer(self, logbook: ExecLog) -> None:
        buf = bytearray(_NOTIF.size)
        try:
            fcntl.ioctl(logbook.fd, _NOTIF_RECV, buf)
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # the caller died before it was read
                return
            # Every process of the filter is gone (or the fd is broken): stop serving.
            self._drop(logbook)
            return
        nid, pid, _, nr, _, _, *args = _NOTIF.unpack(buf)
        try:
            run = self._read_run(pid, nr, args)
            # Only if the caller still waits was what we read its memory.
            fcntl.ioctl(logbook.fd, _NOTIF_ID_VALID, struct.pack("=Q", nid))
        except OSError:
            run = None
        # Logged before the answer: once answered, the program may finish and its call
        # return (and be read) before this thread runs again.
        if run is not None:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # a thread other than the leader: no exit status then
                pidfd = -1
            logbook._add(run, pidfd)
        with contextlib.suppress(OSError):  # the caller died meanwhile
            fcntl.ioctl(logbook.fd, _NOTIF_SEND, _RESP.pack(nid, 0, 0, _FLAG_CONTINUE))

    def _calls(self) -> dict[int, str]:
        if self._machine_calls is None:
            self._machine_calls = {v: k for k, v in _table(None)[2].items()}
        return self._machine_calls

    def _read_run(self, pid: int, nr: int, args: list[int]) -> ProgramRun | None:
        name = self._calls().get(nr, "execve")
        if name == "execveat":
            dirfd, path_at, argv_at, flags = _signed(args[0]), args[1], args[2], args[4]
        else:
            dirfd, path_at, argv_at, flags = _AT_FDCWD, args[0], args[1], 0
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            path = _text(_read_str(mem, path_at, _MAX_PATH)) if path_at else ""
            argv = _read_argv(mem, argv_at)
        finally:
            os.close(mem)
        cwd = _readlink(f"/proc/{pid}/cwd")
        # Where the file is, seen through the caller's own root and working directory.
        where = f"/proc/{pid}/root{path}" if path.startswith("/") else f"/proc/{pid}/cwd/{path}"
        at_fd = False  # relative to a descriptor (execveat): resolved through it instead
        if name == "execveat":
            if path == "" and flags & _AT_EMPTY_PATH:
                where, at_fd = f"/proc/{pid}/fd/{dirfd}", True
                path = _readlink(where)
            elif not path.startswith("/") and dirfd != _AT_FDCWD:
                where, at_fd = f"/proc/{pid}/fd/{dirfd}/{path}", True
                path = f"{_readlink(f'/proc/{pid}/fd/{dirfd}').rstrip('/')}/{path}"
        if not (_executable(where) if at_fd else _executable_in_root(pid, path, cwd, where)):
            # The kernel will refuse it (ENOENT, EACCES): a PATH search trying its next
            # directory, not a program that ran.
            return None
        return ProgramRun(path=path, argv=argv, cwd=cwd, pid=pid)


def _executable_in_root(pid: int, path: str, cwd: str, fallback: str) -> bool:
    """Whether ``path``, resolved as process ``pid`` resolves it, is an executable file.

    Through ``openat2(RESOLVE_IN_ROOT)`` on the process's root: a symlink to an
    absolute path inside the sandbox (``ln -s /tmp/x p; ./p``) resolves in the sandbox,
    not on the host. Falls back to :func:`_executable` of ``fallback`` where
    ``openat2`` is missing.
    """
    inside = path if path.startswith("/") else posixpath.join(cwd or "/", path)
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        how = struct.pack("=QQQ", os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT)
        lib = libc()
        lib.syscall.restype = ctypes.c_long
        fd = lib.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_long(root),
            inside.encode("utf-8", errors="surrogateescape"),
            how,
            ctypes.c_size_t(len(how)),
        )
        if fd < 0:
            if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
                return _executable(fallback)
            return False
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    finally:
        os.close(root)
    return stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


def _executable(where: str) -> bool:
    try:
        st = os.stat(where)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _read_str(mem: int, addr: int, limit: int) -> bytes:
    """A NUL-terminated string at ``addr`` of another process, at most ``limit`` bytes."""
    out = bytearray()
    while len(out) < limit:
        # Never read across a page boundary: the next page may be unmapped.
        chunk = min(4096 - (addr % 4096), limit - len(out))
        data = os.pread(mem, chunk, addr)
        if not data:
            break
        end = data.find(b"\0")
        if end >= 0:
            out += data[:end]
            break
        out += data
        addr += len(data)
    return bytes(out)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _read_argv(mem: int, addr: int) -> list[str]:
    raw: list[bytes] = []
    if addr:
        for i in range(_MAX_ARGS):
            word = os.pread(mem, 8, addr + 8 * i)
            if len(word) < 8:
                break
            (ptr,) = struct.unpack("=Q", word)
            if ptr == 0:
                break
            raw.append(_read_str(mem, ptr, _MAX_PATH + 1))
    return capped_argv(raw)


def capped_argv(argv: list[bytes] | list[str] | tuple[str, ...]) -> list[str]:
    """``argv`` as the record holds it: at most 256 arguments, 4096 bytes each, 8192 in all."""
    out: list[str] = []
    budget = MAX_ARGV_BYTES
    for arg in argv[:_MAX_ARGS]:
        if budget <= 0:
            break
        data = arg if isinstance(arg, bytes) else arg.encode("utf-8", errors="surrogateescape")
        data = data[: min(budget, _MAX_PATH)]
        budget -= len(data) + 1
        out.append(_text(data))
    return out


_TRACER: ExecTracer | None = None
_TRACER_LOCK = threading.Lock()


def exec_tracer() -> ExecTracer:
    """The process's tracer, started on first use (and again in a forked child)."""
    global _TRACER
    with _TRACER_LOCK:
        if _TRACER is None:
            _TRACER = ExecTracer()
        return _TRACER


def _forget_after_fork() -> None:
    global _TRACER, _TRACER_LOCK
    _TRACER, _TRACER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
