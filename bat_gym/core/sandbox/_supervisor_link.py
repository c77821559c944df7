"""The host's end of a supervisor (``_supervisor.py``): its pipes and its protocol.

A supervisor takes requests (python calls, kills, resets) as length-prefixed JSON
frames on one pipe and replies on another; bash calls go as ``CPU_SECONDS SEQ`` lines
to its bash server, whose output and status come back on pipes of their own. Every
one of these pipes runs between this process and the supervisor (or its bash server)
alone: agent code never holds one, so nothing it writes can pass for a reply or a
status. A reply that never comes, or one that is malformed, is returned as ``None``,
and the caller restarts the sandbox rather than guess what the call did.

Both backends speak to their supervisor through this class: the local backend
passes the supervisor's ends of :func:`make_pipes` to its bubblewrap process, the
docker backend hands them to its container over a unix socket, in the same order
(:data:`_supervisor.LINK_FDS`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable

from bat_gym.core.sandbox import _supervisor, fdwait
from bat_gym.core.sandbox.base import ExecResult, Provenance
from bat_gym.core.sandbox.exec_trace import ExecLog, exec_tracer

__all__ = ["SupervisorLink", "exec_listener", "make_pipes", "provenance", "to_result"]

# Longest single wait for a reply. The kernel may hand a signal (Ctrl-C, SIGTERM) to
# another thread of this process; that does not interrupt the wait, and Python runs
# the handler only once this thread runs bytecode again.
_SIGNAL_POLL_S = 0.5
REPLY_GRACE_S = 5.0
"""How long past its own timeout a call's reply may take before the link is lost."""
PRELOAD_GRACE_S = 30.0
"""Extra time for a supervisor's first python call, which imports its preload modules."""


def _wait_s(deadline: float) -> float:
    return max(0.0, min(deadline - time.monotonic(), _SIGNAL_POLL_S))


def make_pipes() -> tuple[list[int], list[int]]:
    """Five pipes as ``(host ends, supervisor ends)``, each in ``LINK_FDS`` order.

    The host writes requests and bash call lines and reads replies, bash output and
    bash status. The host's ends are close-on-exec.
    """
    ours: dict[str, int] = {}
    theirs: dict[str, int] = {}
    for name in _supervisor.LINK_FDS:
        r, w = os.pipe2(os.O_CLOEXEC)
        host_writes = name in ("req_fd", "bash_ctl")
        ours[name], theirs[name] = (w, r) if host_writes else (r, w)
    names = _supervisor.LINK_FDS
    return [ours[n] for n in names], [theirs[n] for n in names]


class SupervisorLink:
    """Requests and bash calls to one running supervisor.

    Args:
        fds: the host's ends from :func:`make_pipes`; owned (closed by :meth:`close`).
        call_fd: the file the bash server sources each call from, open for writing
            here and bound read-only in the sandbox.
        max_output: bytes of a bash call's output kept (head and tail).
    """

    def __init__(self, fds: list[int], call_fd: int, max_output: int) -> None:
        named = dict(zip(_supervisor.LINK_FDS, fds, strict=True))
        self.req, self.resp = named["req_fd"], named["resp_fd"]
        self.bash_ctl, self.bash_out = named["bash_ctl"], named["bash_out"]
        self.bash_status = named["bash_status"]
        self.call_fd = call_fd
        self.max_output = max_output
        self.python_warm = False  # a new supervisor imports its preload at its first python call
        self.seq = 0  # tags bash calls; only the status line with this call's tag is accepted
        self._status_buf = b""
        self._fds = list(fds)
        # Set once a reply failed to come: a late one could be taken for the answer to
        # a later request, so nothing more is asked of this supervisor.
        self.broken = False
        os.set_blocking(self.bash_out, False)

    def close(self) -> None:
        """Close the host's ends: the supervisor sees its request pipe end and exits."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    def recv(self, timeout_s: float) -> dict | None:
        """The next reply frame, or ``None`` if none came in time or it was malformed."""
        reply = self._recv(timeout_s)
        if reply is None:
            self.broken = True
        return reply

    def _recv(self, timeout_s: float) -> dict | None:
        if self.broken:
            return None
        deadline = time.monotonic() + timeout_s
        while not fdwait.readable([self.resp], _wait_s(deadline)):
            if time.monotonic() >= deadline:
                return None
        try:
            reply = _supervisor.recv_frame(self.resp)
        except (EOFError, OSError, ValueError):
            return None
        return reply if isinstance(reply, dict) else None

    def call(self, request: dict, timeout_s: float) -> dict | None:
        """One round trip; ``None`` means the supervisor died or went silent."""
        if self.broken:
            return None
        try:
            _supervisor.send_frame(self.req, request)
        except OSError:
            self.broken = True
            return None
        return self.recv(timeout_s)

    def ok(self, op: str, output: _supervisor.OutputCapture | None = None) -> bool:
        """Send ``kill``, ``reset`` or ``ping``; True if the supervisor did it.

        After a kill or reset no shell runs: what is left in the bash pipes is the
        killed processes' output (fed to ``output`` if given) and stale status bytes.
        """
        timeout = REPLY_GRACE_S * 2 if op == "reset" else REPLY_GRACE_S
        reply = self.call({"op": op}, timeout)
        if reply is None or not reply.get("ok"):
            return False
        if op != "ping":
            (output or _supervisor.OutputCapture(0)).drain(self.bash_out)
            self._drain_status()
        return True

    def run(self, language: str, code: str, timeout: float, cpu_s: int) -> dict | None:
        """A ``python`` or ``bash`` call; ``None`` means no trustworthy result came."""
        if language == "bash":
            return self.exec_bash(code, timeout, cpu_s)
        return self.exec_python(code, timeout, cpu_s)

    def exec_python(self, code: str, timeout: float, cpu_s: int) -> dict | None:
        """Run a python call; the supervisor enforces the timeout and replies."""
        request = {
            "op": "exec",
            "language": "python",
            "code": code,
            "timeout_s": timeout,
            "cpu_s": cpu_s,
            "max_output": self.max_output,
        }
        grace = REPLY_GRACE_S if self.python_warm else REPLY_GRACE_S + PRELOAD_GRACE_S
        reply = self.call(request, timeout + grace)
        self.python_warm = reply is not None
        if reply is None or not _is_result(reply):
            return None
        return reply

    def exec_bash(self, code: str, timeout: float, cpu_s: int) -> dict | None:
        """Hand a call to the bash server's waiting subshell and collect its status."""
        cap = _supervisor.OutputCapture(self.max_output)
        _supervisor.OutputCapture(0).drain(self.bash_out)  # left by earlier background jobs
        try:
            data = code.encode("utf-8", errors="surrogateescape")  # raw bytes of odd names
        except UnicodeEncodeError:  # a lone surrogate no byte stands for
            data = code.encode("utf-8", errors="replace")
        os.pwrite(self.call_fd, data, 0)
        os.ftruncate(self.call_fd, len(data))
        start = time.monotonic()
        deadline = start + timeout
        self.seq += 1
        tag = str(self.seq).encode()
        try:
            os.write(self.bash_ctl, b"%d %s\n" % (cpu_s, tag))
        except OSError:
            return None
        status: bytes | None = None
        while status is None:
            if deadline - time.monotonic() <= 0:
                if not self.ok("kill", output=cap):
                    return None
                return {
                    "exit_code": None,
                    "output": cap.text(),
                    "output_bytes": cap.total,
                    "duration_s": time.monotonic() - start,
                    "timed_out": True,
                }
            ready = fdwait.readable([self.bash_out, self.bash_status], _wait_s(deadline))
            if self.bash_out in ready:
                cap.drain(self.bash_out)
            if self.bash_status in ready:
                try:
                    chunk = os.read(self.bash_status, 4096)
                except OSError:
                    return None
                if not chunk:
                    return None
                *lines, self._status_buf = (self._status_buf + chunk).split(b"\n")
                for line in lines:
                    # Lines with another tag, or none, are from calls already given up
                    # on or from a server that died between calls: never ours.
                    seq, _, value = line.partition(b" ")
                    if seq == tag:
                        status = value
        cap.drain(self.bash_out)
        if status == b"X":  # the call killed its own shell
            cap.feed(b"\n[the shell running this call was killed]\n")
            rc = -signal.SIGKILL
        elif status.isdigit():
            rc = int(status)
        else:  # only the server and the supervisor write after the tag
            return None
        return {
            "exit_code": rc,
            "output": cap.text(),
            "output_bytes": cap.total,
            "duration_s": time.monotonic() - start,
            "timed_out": False,
        }

    def _drain_status(self) -> None:
        """Drop status bytes of killed calls; call it only when no shell is running."""
        os.set_blocking(self.bash_status, False)
        with contextlib.suppress(BlockingIOError):
            while os.read(self.bash_status, 4096):
                pass
        os.set_blocking(self.bash_status, True)
        self._status_buf = b""


def _is_result(reply: dict) -> bool:
    """Whether a reply has the fields of a call's result, with their types."""
    return (
        (reply.get("exit_code") is None or isinstance(reply.get("exit_code"), int))
        and isinstance(reply.get("output"), str)
        and isinstance(reply.get("output_bytes"), int)
        and isinstance(reply.get("duration_s"), (int, float))
        and isinstance(reply.get("timed_out"), bool)
    )


def to_result(
    reply: dict,
    timeout: float,
    stop_leftovers: Callable[[], bool],
    record: Callable[[], Provenance],
) -> ExecResult:
    """A call's :class:`ExecResult` from its reply.

    Args:
        reply: what :meth:`SupervisorLink.run` returned (not ``None``).
        timeout: the call's timeout in seconds, for the note on a timed-out call.
        stop_leftovers: kills what a finished call left running; True if anything was.
        record: the call's provenance, taken once the call is over.
    """
    output = reply["output"]
    if reply["timed_out"]:
        output += f"\n[timed out after {timeout:g} s: every process in the sandbox was killed]"
    elif stop_leftovers():
        output += "\n[processes this call left running were stopped: none outlives its call]"
    return ExecResult(
        exit_code=reply["exit_code"],
        output=output,
        output_bytes=reply["output_bytes"],
        duration_s=reply["duration_s"],
        timed_out=reply["timed_out"],
        provenance=record(),
    )


def provenance(
    reads: frozenset[str] | None, execs: ExecLog | None, current: ExecLog | None
) -> Provenance:
    """A call's record: its workspace ``reads``, and the programs it ran.

    The runs come from ``execs`` only while that is still the running supervisor's log
    (``current``): a restart during the call loses them.
    """
    if execs is None or execs is not current:
        return Provenance(reads=reads)
    runs, dropped = execs.take()
    return Provenance(runs=runs, runs_dropped=dropped, reads=reads)


def exec_listener(sock: socket.socket, joins: int) -> tuple[ExecLog | None, str]:
    """Receive the supervisor's exec listener on ``sock`` and serve it.

    Args:
        sock: the socket the supervisor sends it on (see ``_supervisor._hand_over_exec_listener``).
        joins: how many cgroup descriptors the bash server is started with.

    Returns:
        The log of programs run, or ``None`` with the note to show for why there is none.
    """
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 512, 1)
    except OSError as exc:
        msg, fds = f"error {exc}".encode(), []
    if msg == b"ok" and fds:
        # The bash server is the sandbox's own program, not the agent's.
        server = ("bash", "--noprofile", "--norc", "-c", _supervisor.bash_server(joins))
        return exec_tracer().watch(fds[0], ignore=frozenset({server})), ""
    for fd in fds:
        os.close(fd)
    why = msg.decode(errors="replace").removeprefix("error ").strip() or "no reply"
    return None, f"programs run are not recorded: the exec filter failed ({why})"
