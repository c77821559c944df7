"""The process that runs inside a sandbox and executes agent code.

It is started once per sandbox, as PID 1 of the sandbox's PID namespace: the local
backend's bubblewrap namespace, or the docker backend's container, whose main process
it is (it then takes its configuration and pipes from the host over a unix socket,
see ``_connect``; the protocol is the same). The kernel drops every signal sent to
PID 1 from inside its namespace unless PID 1 handles it, and the only signal handled
here is ``SIGCHLD``, which just wakes the reaper: agent code can neither kill nor stop
the supervisor. It marks itself non-dumpable (so code it forks cannot read or write its
memory or descriptors through ``/proc``, nor ``ptrace`` it), reaps the orphans agent code leaves behind (their zombies would otherwise
count against ``RLIMIT_NPROC``), and answers framed JSON requests on one pipe,
replying on another. Agent code never sees these descriptors: every call runs in a
fresh child with its own output pipe.

* ``python`` calls fork this interpreter and ``exec`` the code in a new ``__main__``, as
  ``python -c`` would. The modules named in ``preload`` are imported here at the first
  python call, so later calls start warm and an env that never runs python does not
  carry them. Where the host asks for it (``python_spare``), the next call's process
  is forked and set up as soon as a call's reply is sent, and the call only hands it
  its code (see ``Supervisor._take_spare`` for what keeps that process pristine).
* ``bash`` calls go from the host straight to a long-lived bash server that this
  process starts from an execute-only copy of bash (the kernel marks such a process
  non-dumpable too). The server reads the next call line, ``CPU_SECONDS SEQ``, and
  forks a subshell for it, which writes ``SEQ`` and a space on the status pipe, closes
  it, and runs the call; the server then completes the line with ``$?``. Between calls
  the server is the only process of the agent's cgroup, so the host can tell from one
  count whether a call left anything running.
  Each call starts from the server's pristine state, so nothing one call does to its
  shell can change how a later call runs or is reported; the host accepts only the
  status line tagged with the call it sent. If the server dies, this process kills its
  process group, waits until that group is gone, writes ``X`` and a newline (which
  completes ``SEQ X`` if a call was running) and starts another server.

A kill (a call that overran its deadline) or a reset kills every process in the
sandbox except this one, waits until all are gone, and discards call lines no shell
has read yet, so a call that timed out before it started never runs later. A reset
also empties ``/tmp`` and ``/dev/shm`` and removes System V IPC objects: nothing the
agent leaves there survives into the next episode.

This module must import nothing outside the standard library: it runs under the
sandbox's interpreter, where bat_gym itself is hidden. The one exception is
``trees.py`` (standard library only itself), which the host hands over as a file of
its own (``cfg["trees"]``) and which is loaded under a private name, so that emptying
``/tmp`` walks any tree agent code made without recursing.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import fcntl
import io
import json
import marshal
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import types

__all__ = [
    "BASH_SERVER",
    "LINK_FDS",
    "OutputCapture",
    "bash_server",
    "recv_frame",
    "send_frame",
]

_HEADER = struct.Struct("!Q")

# Reads each call line on fd 3 and runs the call in a subshell that writes the call's
# tag on the status descriptor (fd 4), closes both and limits its CPU time; the parent
# reports the status. stdin is /dev/null throughout. Variables are prefixed so agent
# code is unlikely to collide with them, and they are unset in the subshell.
BASH_SERVER = r"""
while IFS=' ' read -r -u 3 __bat_cpu __bat_seq || kill -KILL $$; do  # host gone: stop
  ( printf '%s ' "$__bat_seq" >&4; exec 3<&- 4>&-
    ulimit -t "$__bat_cpu"; unset __bat_cpu __bat_seq; . "$__bat_call" )
  printf '%s\n' "$?" >&4
done
"""

# Where the host caps the sandbox (cgroups), the bash server joins the agent group
# through descriptors 5 and up before it serves any call (see _join).
_JOIN_FD = 5


def bash_server(joins: int) -> str:
    """The server script, first moving itself into the agent group through ``joins`` fds."""
    fds = range(_JOIN_FD, _JOIN_FD + joins)
    prefix = "".join(f"printf 0 >&{fd} || exit 1; exec {fd}>&-\n" for fd in fds)
    return prefix + BASH_SERVER


def _join(fds: list[int]) -> None:
    """Move this process into the cgroups behind ``fds`` and close them.

    The protocol of ``bat_gym.core.sandbox.cgroups.join``, copied: this file imports only
    the standard library. A failed write raises; the caller must not run agent code.
    """
    try:
        for fd in fds:
            os.write(fd, b"0")
    finally:
        for fd in fds:
            os.close(fd)


# Signals whose disposition a process may set (and so inherit as ignored).
_CATCHABLE = frozenset(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_IPC_RMID = 0
# How long this process waits, idle after a python call, before it forks the next
# call's process; longer than the host takes to send a request right after a reply.
_SPARE_DELAY_S = 0.002


def send_frame(fd: int, obj: object) -> None:
    """Write one length-prefixed JSON frame."""
    data = json.dumps(obj).encode()
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            raise EOFError("peer closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(fd: int) -> dict:
    """Read one length-prefixed JSON frame (blocking)."""
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return json.loads(_read_exact(fd, n))


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


class OutputCapture:
    """Collects a call's output, keeping its head and its tail within ``cap`` bytes.

    The first half of the budget keeps the start (what the call printed first) and the
    second half the end (where errors and tracebacks land); ``total`` counts every byte.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            keep = self.cap - self.cap // 2
            if len(self.tail) > 2 * keep:  # trim now and then, not on every chunk
                del self.tail[:-keep]

    def drain(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.feed(chunk)

    def text(self) -> str:
        keep = self.cap - self.cap // 2
        tail = bytes(self.tail[-keep:]) if keep else b""
        cut = self.total - len(self.head) - len(tail)
        middle = f"\n[... {cut} bytes of output cut ...]\n".encode() if cut > 0 else b""
        return (bytes(self.head) + middle + tail).decode("utf-8", errors="replace")


_RLIMITS = tuple(getattr(resource, n) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))


def _state_of(pid: int) -> tuple:
    """What a process of the same uid may change about process ``pid`` (0: this one).

    Its resource limits, its nice value and its CPU affinity: about twenty system
    calls, some microseconds. Reading them needs no more than changing them does.
    """
    return (
        tuple(resource.prlimit(pid, r) for r in _RLIMITS),
        os.getpriority(os.PRIO_PROCESS, pid),
        tuple(sorted(os.sched_getaffinity(pid))),
    )


def _own_state() -> tuple:
    return _state_of(0)


def _exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (its pidfd polls readable)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def _exit_code(info: os.waitid_result) -> int:
    """``waitid`` result as an exit code: the status, or minus the killing signal."""
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _above_4(fd: int) -> int:
    """Move ``fd`` to a close-on-exec descriptor numbered 10 or more."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def _load_trees(path: str, name: str = "_bat_gym_trees") -> types.ModuleType:
    """Load a helper file (``trees.py``) under a name agent code will not import by accident."""
    # By hand, not importlib.util: that module and what it imports would stay in this
    # process's memory for good, in every sandbox.
    module = types.ModuleType(name)
    module.__file__ = path
    with open(path, "rb") as f:
        data = f.read()
    # A ``.code`` file is the module compiled by the host for this interpreter.
    code = marshal.loads(data) if path.endswith(".code") else compile(data, path, "exec")
    exec(code, module.__dict__)
    return module


def _empty_dir(path: str, trees: types.ModuleType) -> None:
    """Delete everything in ``path``, including deep trees agent code made read-only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for name in os.listdir(fd):
            if os.path.ismount(os.path.join(path, name)):
                continue
            with contextlib.suppress(OSError):
                trees.remove_tree(fd, name)
    finally:
        os.close(fd)


def _remove_sysv_ipc() -> None:
    """Remove every System V shared memory segment, message queue and semaphore set.

    They live in the sandbox's IPC namespace, outside any file system, and would
    otherwise carry state from one episode into the next.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for table, remove in (
        ("shm", lambda i: libc.shmctl(i, _IPC_RMID, None)),
        ("msg", lambda i: libc.msgctl(i, _IPC_RMID, None)),
        ("sem", lambda i: libc.semctl(i, 0, _IPC_RMID)),
    ):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            remove(int(row.split()[1]))


class Supervisor:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.workspace = cfg["workspace"]
        self.pid_namespace = cfg["pid_namespace"]
        self.trees = _load_trees(cfg["trees"])
        # Whatever this process inherited is close-on-exec from here on, and its own
        # pipe ends move above 4, where handing fds 0-4 to the bash server cannot
        # overwrite one still to be handed.
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2:
                with contextlib.suppress(OSError):
                    os.set_inheritable(int(name), False)
        self.req_fd, self.resp_fd = _above_4(cfg["req_fd"]), _above_4(cfg["resp_fd"])
        # The host holds the other ends of these: it writes calls and reads output.
        self.bash_ctl, self.bash_out, self.bash_status = map(_above_4, cfg["bash_fds"])
        # Joins the agent cgroup: handed to every process that runs agent code, which
        # writes to it and closes it first. Never inherited past that.
        self.agent_fds = [_above_4(fd) for fd in cfg.get("agent_cgroup_fds", [])]
        # Where this process shares its memory limit with agent code (a container),
        # agent processes start with a higher OOM score (see _agent_oom).
        self.pid = os.getpid()
        self.oom = int(cfg.get("agent_oom_score_adj") or 0)
        self.oom_fd, self.oom_base = -1, b"0"
        if cfg.get("oom_fd", -1) >= 0:
            self.oom_fd = _above_4(cfg["oom_fd"])
            self.oom_base = os.pread(self.oom_fd, 16, 0).strip()
            try:  # lowering it back must work, or it is never raised
                os.pwrite(self.oom_fd, b"%d" % min(int(self.oom_base) + 1, 1000), 0)
                os.pwrite(self.oom_fd, self.oom_base, 0)
            except OSError:
                os.close(self.oom_fd)
                self.oom_fd = -1
        self.bash: int | None = None  # pid (and process group) of the bash server
        self.bash_pidfd = -1
        self.child: int | None = None  # pid of the python call running now
        # The process forked ahead for the next python call: (pid, pidfd, code socket,
        # output pipe). See _take_spare for what keeps it pristine.
        self.spare: tuple[int, int, int, int] | None = None
        self.preloaded = False
        self.exited: dict[int, int] = {}  # exit codes of the two above, if reaped early
        self.pgids: set[int] = set()  # process groups of running calls (unisolated kill)
        # SIGCHLD wakes the loops below through this pipe; its handler does nothing.
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.own_state = _own_state()

    # -- lifecycle ------------------------------------------------------------------

    def serve(self) -> None:
        self._make_dirs()
        self._start_bash()
        send_frame(self.resp_fd, {"ready": True})
        spare_due = False
        while True:
            watch = [self.req_fd, self.wake_r]
            if self.bash is not None:
                watch.append(self.bash_pidfd)
            ready, _, _ = select.select(watch, [], [], _SPARE_DELAY_S if spare_due else None)
            if spare_due and not ready:
                # Idle since a python call: fork the next call's process now. Not at
                # once: a request that follows at once would wait for the fork.
                spare_due = False
                self._fork_spare()
                continue
            if self.wake_r in ready:
                _drain(self.wake_r)
                self._reap()
            if self.bash is not None and self.bash_pidfd in ready:
                self._bash_died()
            if self.req_fd not in ready:
                continue
            try:
                req = recv_frame(self.req_fd)
            except EOFError:
                self._kill_all()
                return
            if _own_state() != self.own_state:
                # Agent code of this uid lowered a limit or the priority of this process
                # (prlimit, setpriority and sched_setaffinity need no more than the
                # same uid). It cannot be undone from here, and it would outlast every
                # reset: stop without a reply, and the host starts a fresh sandbox.
                self._kill_all()
                return
            op = req.get("op")
            if op == "exec":
                reply = self._exec_python(req)
            elif op in ("kill", "reset"):
                self._kill_all()
                if op == "reset":
                    self._clear_scratch()
                reply = {"ok": True}
            elif op == "ping":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {op!r}"}
            send_frame(self.resp_fd, reply)
            self._start_bash()  # after a kill or reset; overlaps with the host's restore
            spare_due = op == "exec" and bool(self.cfg.get("python_spare"))

    def _start_bash(self) -> None:
        if self.bash is not None:
            return
        # posix_spawn, not fork: copying this interpreter's page tables (numpy and all)
        # would cost more than the rest of a reset. The server gets fds 0-4 only:
        # /dev/null, output twice, call lines, status; everything else here is
        # close-on-exec.
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, self.bash_out, 1),
            (os.POSIX_SPAWN_DUP2, self.bash_out, 2),
            (os.POSIX_SPAWN_DUP2, self.bash_ctl, 3),
            (os.POSIX_SPAWN_DUP2, self.bash_status, 4),
        ]
        actions += [(os.POSIX_SPAWN_DUP2, fd, _JOIN_FD + i) for i, fd in enumerate(self.agent_fds)]
        try:
            self._agent_oom(True)
            pid = os.posix_spawn(
                self.cfg["bash"],
                ["bash", "--noprofile", "--norc", "-c", bash_server(len(self.agent_fds))],
                dict(self.cfg["env"], __bat_call=self.cfg["call_file"]),
                file_actions=actions,
                setpgroup=0,
                # Every disposition back to its default: Python ignores SIGPIPE and
                # SIGXFSZ, and a host started under nohup or in the background ignores
                # SIGHUP, SIGINT and SIGQUIT, which exec would pass on to agent code.
                setsigdef=_CATCHABLE,
            )
        except OSError:
            return  # agent code holds every process slot; retried after the next request
        finally:
            self._agent_oom(False)
        self.bash = pid
        self.bash_pidfd = os.pidfd_open(pid)
        self.pgids.add(pid)

    def _agent_oom(self, raised: bool) -> None:
        """Raise (or restore) this process's OOM score around the start of agent code.

        The process started inherits the raised score, so when the container runs out
        of memory the kernel kills agent code first, not this process (whose death
        costs a restart). The descriptor was opened before this process became
        non-dumpable: from then on only a descriptor opened earlier may write it.
        """
        if self.oom_fd >= 0:
            with contextlib.suppress(OSError):
                os.pwrite(self.oom_fd, b"%d" % self.oom if raised else self.oom_base, 0)

    def _forget_bash(self) -> None:
        assert self.bash is not None
        os.close(self.bash_pidfd)
        self.pgids.discard(self.bash)
        self.exited.pop(self.bash, None)
        self.bash, self.bash_pidfd = None, -1

    def _bash_died(self) -> None:
        """The server was killed from inside: end its calls, report, start another."""
        assert self.bash is not None
        group = self.bash
        # A subshell it forked may still be running a call; left alive
        # it would race the next server for the host's next call.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self._reap_group(group)
        self._forget_bash()
        os.write(self.bash_status, b"X\n")
        self._start_bash()

    def _record(self, info: os.waitid_result | None) -> None:
        if info is not None and info.si_pid in (self.bash, self.child):
            self.exited[info.si_pid] = _exit_code(info)

    def _reap(self) -> None:
        """Collect every child that has exited, without blocking."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                return
            if info is None:
                return
            self._record(info)

    def _reap_group(self, pgid: int | None) -> None:
        """Block until no child is left in process group ``pgid`` (in any group if None).

        Call it after sending the group SIGKILL. This process is the namespace's init
        (or, unisolated, a child subreaper), so a killed process hands its children to
        it before it can be reaped itself: once no child is left, none is running.
        """
        idtype, ident = (os.P_ALL, 0) if pgid is None else (os.P_PGID, pgid)
        while True:
            try:
                self._record(os.waitid(idtype, ident, os.WEXITED))
            except ChildProcessError:
                return

    def _kill_all(self) -> None:
        """Kill every process agent code started, wait until all are gone, drop stale calls."""
        if self.spare is not None:
            spare, self.spare = self.spare, None
            self._discard(spare)
        if self.pid_namespace:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)  # from PID 1: everything else in the namespace
            self._reap_group(None)
        else:
            for pgid in self.pgids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            for pgid in self.pgids:
                self._reap_group(pgid)
        if self.bash is not None:
            self._forget_bash()
        self.pgids.clear()
        self.exited.clear()
        # Call lines nobody read belong to calls the host has given up on.
        os.set_blocking(self.bash_ctl, False)
        try:
            _drain(self.bash_ctl)
        finally:
            os.set_blocking(self.bash_ctl, True)

    def _make_dirs(self) -> None:
        os.makedirs(self.cfg["env"]["HOME"], mode=0o700, exist_ok=True)

    def _clear_scratch(self) -> None:
        for path in (self.cfg["tmp"], *self.cfg.get("scratch", [])):
            _empty_dir(path, self.trees)
        if self.pid_namespace:  # unisolated, the IPC namespace is the host's
            _remove_sysv_ipc()
        self._make_dirs()

    # -- python calls -----------------------------------------------------------------

    def _preload(self) -> None:
        """Import the ``preload`` modules once, at the first python call.

        Not at start: they are most of this process's memory (numpy: about 10 MiB of
        private pages), and an env whose agent never runs python should not pay it.
        """
        if not self.preloaded:
            self.preloaded = True
            # From /, not the workspace: nothing agent code left there may be found by
            # an import in this process (its sys.path never holds the workspace).
            os.chdir("/")
            try:
                for name in ("linecache", "traceback", *self.cfg.get("preload", [])):
                    with contextlib.suppress(Exception):
                        __import__(name)
            finally:
                os.chdir(self.workspace)

    def _fork_call(self) -> tuple[int, int, int, int]:
        """Fork the process for a python call; it waits for its code (see ``_call_process``).

        Returns:
            ``(pid, pidfd, the code socket's end, the output pipe's read end)``.

        Raises:
            OSError: no pipe or no process could be had (agent code holds every slot).
        """
        # The code goes one way and the word that it arrived comes back the other.
        code_r, code_w = (s.detach() for s in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
        try:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(code_r)
            os.close(code_w)
            raise
        try:
            self._agent_oom(True)
            pid = os.fork()
        except OSError:
            for fd in (code_r, code_w, out_r, out_w):
                os.close(fd)
            raise
        finally:
            if self.oom_fd >= 0 and os.getpid() == self.pid:  # not in the child
                self._agent_oom(False)
        if pid == 0:
            _call_process(code_r, out_w, self.agent_fds, self.workspace)
        os.close(code_r)
        os.close(out_w)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        self.pgids.add(pid)
        return pid, os.pidfd_open(pid), code_w, out_r

    def _fork_spare(self) -> None:
        """Fork the next python call's process ahead, off the next call's clock."""
        if self.spare is None and self.preloaded:
            with contextlib.suppress(OSError):  # no slot free: the next call forks its own
                self.spare = self._fork_call()

    def _take_spare(self) -> tuple[int, int, int, int] | None:
        """The spare process for this call, or None if there is none fit to use.

        It was forked from this process after the last call ended, never from a call,
        so no module state of an earlier call reaches it. Agent code of the same uid
        cannot read or write its memory, descriptors or registers (it inherited this
        process's non-dumpability, and ``ptrace`` needs that too); it can signal it,
        and change its limits, priority or affinity. So a spare that has exited, or
        whose limits, priority or affinity differ from this process's, is discarded
        (the call gets a fresh fork), and one that was stopped is continued.
        """
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        pid, pidfd = spare[0], spare[1]
        try:
            fit = not _exited(pidfd) and _state_of(pid) == self.own_state
        except OSError:  # gone between the two looks
            fit = False
        if fit:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGCONT)
            return spare
        self._discard(spare)
        return None

    def _discard(self, spare: tuple[int, int, int, int]) -> None:
        """Kill a spare that never got a call and collect it."""
        pid, pidfd, code_w, out_r = spare
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED)
        for fd in (pidfd, code_w, out_r):
            if fd >= 0:  # -1: closed already
                os.close(fd)
        self.pgids.discard(pid)

    def _exec_python(self, req: dict) -> dict:
        # Before the call's clock starts: the import is this process's cost, not the
        # call's (the host allows for it in its wait for the first python reply).
        self._preload()
        start = time.monotonic()
        cap = OutputCapture(int(req["max_output"]))
        deadline = start + float(req["timeout_s"])
        work = {"code": req["code"], "cpu_s": int(req["cpu_s"])}
        spare = self._take_spare()
        while True:
            try:
                pid, pidfd, ctl, out_r = spare or self._fork_call()
            except OSError as exc:
                return _not_started(exc, start)
            self.child = pid
            started = _hand_over(ctl, work, deadline)
            os.close(ctl)
            if started or spare is None:
                # Not started with a fresh process: it died before the code could run
                # (or the deadline passed first); the kernel's status is the result.
                break
            # A spare killed just before this call (its death still under way when it
            # was looked at) never took the code: the call goes to a fresh process.
            self._discard((pid, pidfd, -1, out_r))
            self.child, spare = None, None
        rc, timed_out = None, False
        try:
            os.set_blocking(out_r, False)
            eof = False
            while True:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    timed_out = True
                    break
                watch = [pidfd, self.wake_r] if eof else [out_r, pidfd, self.wake_r]
                ready, _, _ = select.select(watch, [], [], wait)
                if self.wake_r in ready:
                    _drain(self.wake_r)
                    self._reap()
                if out_r in ready:
                    before = cap.total
                    cap.drain(out_r)
                    eof = cap.total == before
                if pidfd in ready:
                    if pid not in self.exited:
                        self._record(os.waitid(os.P_PID, pid, os.WEXITED))
                    rc = self.exited.pop(pid)
                    cap.drain(out_r)
                    break
        finally:
            os.close(pidfd)
            os.close(out_r)
        if timed_out:
            self._kill_all()
        else:
            self.pgids.discard(pid)
        self.child = None
        return {
            "exit_code": rc,
            "output": cap.text(),
            "output_bytes": cap.total,
            "duration_s": time.monotonic() - start,
            "timed_out": timed_out,
        }


def _hand_over(ctl: int, work: dict, deadline: float) -> bool:
    """Send a call's process its code on ``ctl``; True once it has it.

    False if it exited first, or the deadline passed. Only that process writes on
    ``ctl``, and only before any agent code runs, so its word cannot be forged.
    """
    try:
        send_frame(ctl, work)  # small next to a socket's buffer as a rule
        ready, _, _ = select.select([ctl], [], [], max(0.0, deadline - time.monotonic()))
        return bool(ready) and os.read(ctl, 1) == b"!"
    except OSError:
        return False


def _not_started(exc: OSError, start: float) -> dict:
    """The reply for a call that could not start (agent code holds every process slot)."""
    out = f"[the call could not start: {exc.strerror}]\n"
    # 126 is the shell's status for a command that was found but could not run.
    return {
        "exit_code": 126,
        "output": out,
        "output_bytes": len(out),
        "duration_s": time.monotonic() - start,
        "timed_out": False,
    }


def _call_process(code_r: int, out_w: int, agent_fds: list[int], workspace: str) -> None:
    """Become a fresh ``python -c CODE`` process once CODE arrives on ``code_r``.

    Everything that does not depend on the call is set up before the code is read, so
    a process forked ahead (a spare) has it done off the call's clock. Never returns.
    """
    rc = 1
    try:
        # Undo the supervisor's signal set-up; SIGPIPE and SIGXFSZ stay ignored, as
        # in any Python process.
        signal.set_wakeup_fd(-1)
        for sig in _CATCHABLE - {signal.SIGPIPE, signal.SIGXFSZ}:
            signal.signal(sig, signal.SIG_DFL)  # also what the host ignored (see above)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        # Only the code socket and the cgroup descriptors stay past 2, until the code is
        # read and the caps joined: agent code finds nothing of the supervisor's.
        keep = {code_r, *agent_fds}
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        os.chdir(workspace)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        # Unbuffered, as `python -u`: stdout and stderr interleave in the order written.
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            write_through=True,
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            write_through=True,
        )
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        sys.argv = ["-c"]
        sys.path[0] = ""  # the supervisor's own directory stands here; python -c puts ''
        import linecache  # here, in the call's process: the supervisor stays small
        import traceback

        try:
            req = recv_frame(code_r)
            os.write(code_r, b"!")  # the code arrived: from here, this is the call's process
        except (EOFError, OSError, ValueError):
            os._exit(0)  # discarded before it had a call
        os.close(code_r)
        code, cpu_s = str(req["code"]), int(req["cpu_s"])
        try:
            _join(agent_fds)
        except OSError:
            os._exit(126)  # never run agent code outside its caps
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        npr = sys.modules.get("numpy.random")
        if npr is not None:  # a forked numpy would repeat the parent's random stream
            npr.seed(int.from_bytes(os.urandom(4), "little"))
        linecache.cache["<execute_code>"] = (
            len(code),
            None,
            code.splitlines(True),
            "<execute_code>",
        )
        try:
            exec(compile(code, "<execute_code>", "exec"), main.__dict__)
            rc = 0
        except SystemExit as e:
            if e.code is None:
                rc = 0
            elif isinstance(e.code, int):
                rc = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                rc = 1
        except BaseException as exc:
            # Drop this function's frame: the agent should see its own code only.
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None
            traceback.print_exception(type(exc), exc, tb)
            rc = 1
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os._exit(rc)


def _apply_limits(limits: dict) -> None:
    for name, value in limits.items():
        res = getattr(resource, name)
        resource.setrlimit(res, (value, value))


def _add_site_dirs(dirs: list[str]) -> None:
    """Put the interpreter's site-packages on ``sys.path``, as ``site`` would, minus code.

    The supervisor starts with ``-S``: the ``site`` module's start-up runs every
    ``import`` line of every ``.pth`` file (an editable install's finder alone costs
    tens of milliseconds and megabytes per sandbox), and none of that code has any
    business in this process. The directories, and the plain directory lines of their
    ``.pth`` files, are what agent code needs to import installed packages.
    """
    for d in dirs:
        if d in sys.path or not os.path.isdir(d):
            continue
        sys.path.append(d)
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(d)):
                if not name.endswith(".pth") or name.startswith("."):
                    continue
                path = os.path.join(d, name)
                with contextlib.suppress(OSError, UnicodeDecodeError), open(path) as f:
                    for line in f:
                        line = line.rstrip()
                        if not line or line.startswith(("#", "import ", "import\t")):
                            continue
                        extra = os.path.join(d, line)
                        if os.path.isdir(extra) and extra not in sys.path:
                            sys.path.append(extra)


# The channels a connecting supervisor receives, in the order the host sends them.
LINK_FDS = ("req_fd", "resp_fd", "bash_ctl", "bash_out", "bash_status")


def _connect(path: str) -> dict:
    """Take the configuration and the channels from the host over the unix socket ``path``.

    How the docker backend starts this file: as its container's main process, which
    cannot inherit descriptors from the host. The host listens at ``path`` (in a
    directory bound read-only), accepts this one connection, unlinks the socket and
    sends one frame (the configuration) with the supervisor's ends of the pipes of
    :data:`LINK_FDS` attached. From then on the protocol is the local backend's, over
    pipes that run straight from the host into the container. The socket stays the
    channel on which the exec listener goes back (``exec_sock``).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, len(LINK_FDS))
    data = bytearray(data)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise EOFError("the host closed the link before its configuration was complete")
        data += chunk
    if len(fds) != len(LINK_FDS):
        raise EOFError(f"the host sent {len(fds)} descriptors, not {len(LINK_FDS)}")
    (n,) = _HEADER.unpack_from(data)
    cfg = json.loads(bytes(data[_HEADER.size : _HEADER.size + n]))
    named = dict(zip(LINK_FDS, fds, strict=True))
    cfg["req_fd"], cfg["resp_fd"] = named["req_fd"], named["resp_fd"]
    cfg["bash_fds"] = [named["bash_ctl"], named["bash_out"], named["bash_status"]]
    cfg["exec_sock"] = sock.detach()
    return cfg


def main() -> None:
    cfg = _connect(sys.argv[2]) if sys.argv[1] == "--connect" else json.loads(sys.argv[1])
    _add_site_dirs(cfg.get("site_dirs", []))
    # Into the supervisor's own (uncapped) cgroup first: an agent process that runs
    # the sandbox out of memory is then the one the kernel kills, never this one.
    _join(cfg.get("supervisor_cgroup_fds", []))
    if cfg.get("drop_to"):
        uid, gid = cfg["drop_to"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # from root: every capability is gone after this
    if cfg.get("agent_oom_score_adj") is not None:  # see Supervisor._agent_oom
        cfg["oom_fd"] = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
    _prctl(_PR_SET_DUMPABLE, 0)
    # Unisolated there is no PID namespace: orphans must still come here to be reaped
    # and waited for.
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _apply_limits(cfg["rlimits"])
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Python's SIGINT handler would let agent code raise KeyboardInterrupt here; at
    # SIG_DFL, PID 1 never receives the signal from inside its namespace.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.chdir(cfg["workspace"])
    if cfg.get("exec_filter"):
        _hand_over_exec_listener(cfg["exec_filter"], cfg["exec_sock"])
    Supervisor(cfg).serve()


def _hand_over_exec_listener(path: str, sock_fd: int) -> None:
    """Install the exec-notification filter and send its listener to the host.

    Before the supervisor starts anything: every process it starts from here on,
    the bash server included, reports its ``exec`` calls to the host and waits for
    its answer. On failure the host is told why and nothing is installed.
    """
    sock = socket.socket(fileno=sock_fd)
    try:
        try:
            fd = _load_trees(path, "_bat_gym_exec_filter").install_listener()
        except OSError as exc:
            sock.sendall(f"error {exc}".encode())
            return
        socket.send_fds(sock, [b"ok"], [fd])
        os.close(fd)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
