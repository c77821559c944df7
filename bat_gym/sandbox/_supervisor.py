"""The process that runs inside a local sandbox and executes agent code.

It is started once per sandbox, marks itself non-dumpable (so code it forks cannot
read or write its memory through ``/proc``; ``ptrace`` is denied by seccomp), and
then answers framed JSON requests on fd 3, replying on fd 4. Agent code never sees
these descriptors: every call runs in a fresh child with its own output pipe.

* ``python`` calls fork this (already warm) interpreter and ``exec`` the code in a new
  ``__main__``, as ``python -c`` would, with modules named in ``preload`` imported.
* ``bash`` calls go from the host straight to a long-lived bash server that this
  process starts from an execute-only copy of bash (the kernel marks such a process
  non-dumpable too). The server keeps one subshell forked ahead, waiting for the next
  call; the subshell closes the status descriptor, runs the call, and the server
  reports ``$?``. Each call starts from the server's pristine state, so nothing one
  call does to its shell can change how a later call runs or is reported. If the
  server dies, this process writes ``X`` on the status pipe and starts another.

A call that overruns its deadline kills every process in the sandbox except this one.
This module must import nothing outside the standard library: it runs under the
sandbox's interpreter, where bat_gym itself is hidden.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import linecache
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time
import traceback
import types

__all__ = ["send_frame", "recv_frame", "BASH_SERVER"]

_HEADER = struct.Struct("!Q")

# Runs each call in a subshell: stdin from /dev/null, the status descriptor closed,
# CPU time limited; the parent reports the status. Variables are prefixed so agent
# code is unlikely to collide with them, and they are unset in the subshell.
BASH_SERVER = r"""
while :; do
  ( exec 4>&-; IFS= read -r __bat_cpu || exit 255; exec 0</dev/null
    ulimit -t "$__bat_cpu" 2>/dev/null; unset __bat_cpu; . "$__bat_call" )
  printf '%s\n' "$?" >&4
done
"""


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


def _set_nondumpable() -> None:
    import ctypes

    pr_set_dumpable = 4
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)


class _Capture:
    """Collects a call's output, keeping at most ``cap`` bytes and counting the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

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
        return self.kept.decode("utf-8", errors="replace")


class Supervisor:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.workspace = cfg["workspace"]
        self.pid_namespace = cfg["pid_namespace"]
        self.req_fd, self.resp_fd = cfg["req_fd"], cfg["resp_fd"]
        # The host holds the other ends of these: it writes calls and reads output.
        self.bash_ctl, self.bash_out, self.bash_status = cfg["bash_fds"]
        self.bash: int | None = None  # pid of the bash server
        self.bash_pidfd = -1
        self.pgids: set[int] = set()

    # -- lifecycle ------------------------------------------------------------------

    def serve(self) -> None:
        for name in self.cfg.get("preload", []):
            with contextlib.suppress(Exception):
                __import__(name)
        self._make_home()
        self._start_bash()
        send_frame(self.resp_fd, {"ready": True, "pid": os.getpid()})
        while True:
            watch = [self.req_fd] + ([self.bash_pidfd] if self.bash is not None else [])
            ready, _, _ = select.select(watch, [], [])
            if self.bash is not None and self.bash_pidfd in ready:
                self._bash_died()
                continue
            try:
                req = recv_frame(self.req_fd)
            except EOFError:
                self._kill_all()
                return
            op = req.get("op")
            if op == "exec":
                reply = self._exec_python(req)
            elif op in ("kill", "reset"):
                self._kill_all()
                if op == "reset":
                    self._clear_tmp()
                reply = {"ok": True}
            elif op == "ping":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {op!r}"}
            send_frame(self.resp_fd, reply)
            self._start_bash()  # after a kill or reset; overlaps with the host's restore

    def _start_bash(self) -> None:
        if self.bash is not None:
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                os.dup2(self.bash_ctl, 0)
                os.dup2(self.bash_out, 1)
                os.dup2(self.bash_out, 2)
                os.dup2(self.bash_status, 4)
                os.closerange(3, 4)
                os.closerange(5, 1 << 16)
                os.chdir(self.workspace)
                env = dict(self.cfg["env"], __bat_call=self.cfg["call_file"])
                os.execve(
                    self.cfg["bash"], ["bash", "--noprofile", "--norc", "-c", BASH_SERVER], env
                )
            finally:
                os._exit(127)
        self.bash = pid
        self.bash_pidfd = os.pidfd_open(pid)
        self.pgids.add(pid)

    def _reap_bash(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.bash, 0)
        os.close(self.bash_pidfd)
        self.pgids.discard(self.bash)
        self.bash, self.bash_pidfd = None, -1

    def _bash_died(self) -> None:
        """The server was killed from inside: fail the call in flight, start another."""
        self._reap_bash()
        os.write(self.bash_status, b"X\n")
        self._start_bash()

    def _kill_all(self) -> None:
        """Kill every process the agent started; in a PID namespace, all but us."""
        if self.pid_namespace:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
        else:
            for pgid in self.pgids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        if self.bash is not None:
            self._reap_bash()
        self.pgids.clear()
        while True:  # reap our other children
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.0005)
        if self.pid_namespace:
            self._await_no_others()

    def _await_no_others(self) -> None:
        # Orphans are reaped by the namespace's init; wait until none still runs, so the
        # host may restore the workspace with no writer left.
        me = os.getpid()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            alive = False
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in (1, me):
                    continue
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        state = f.read().rsplit(b")", 1)[1].split()[0]
                except OSError:
                    continue
                if state not in (b"Z", b"X"):
                    alive = True
                    break
            if not alive:
                return
            time.sleep(0.0005)

    def _make_home(self) -> None:
        os.makedirs(self.cfg["env"]["HOME"], mode=0o700, exist_ok=True)

    def _clear_tmp(self) -> None:
        tmp = self.cfg["tmp"]
        for name in os.listdir(tmp):
            path = os.path.join(tmp, name)
            if os.path.ismount(path):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        self._make_home()

    # -- python calls -----------------------------------------------------------------

    def _exec_python(self, req: dict) -> dict:
        start = time.monotonic()
        cap = _Capture(int(req["max_output"]))
        deadline = start + float(req["timeout_s"])
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            _child_python(req["code"], int(req["cpu_s"]), out_w, self.workspace)
        os.close(out_w)
        self.pgids.add(pid)
        pidfd = os.pidfd_open(pid)
        rc, timed_out = None, False
        try:
            os.set_blocking(out_r, False)
            eof = False
            while True:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([pidfd] if eof else [out_r, pidfd], [], [], wait)
                if out_r in ready:
                    before = cap.total
                    cap.drain(out_r)
                    eof = cap.total == before
                if pidfd in ready:
                    _, status = os.waitpid(pid, 0)
                    cap.drain(out_r)
                    self.pgids.discard(pid)
                    rc = os.waitstatus_to_exitcode(status)
                    break
        finally:
            os.close(pidfd)
            os.close(out_r)
        if timed_out:
            self._kill_all()
        return {
            "exit_code": rc,
            "output": cap.text(),
            "output_bytes": cap.total,
            "duration_s": time.monotonic() - start,
            "timed_out": timed_out,
        }


def _child_python(code: str, cpu_s: int, out_w: int, workspace: str) -> None:
    """Become a fresh ``python -c code`` process. Never returns."""
    rc = 1
    try:
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.closerange(3, 1 << 16)
        os.chdir(workspace)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
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
        npr = sys.modules.get("numpy.random")
        if npr is not None:  # a forked numpy would repeat the parent's random stream
            npr.seed(int.from_bytes(os.urandom(4), "little"))
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        sys.argv = ["-c"]
        sys.path[0] = ""  # the supervisor's own directory stands here; python -c puts ''
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


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("drop_to"):
        uid, gid = cfg["drop_to"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # from root: every capability is gone after this
    _set_nondumpable()
    _apply_limits(cfg["rlimits"])
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.chdir(cfg["workspace"])
    Supervisor(cfg).serve()


if __name__ == "__main__":
    main()
