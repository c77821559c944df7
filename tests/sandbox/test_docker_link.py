"""The docker backend's link to its supervisor, without an engine.

The docker backend starts ``_supervisor.py --connect SOCKET`` as its container's main
process and hands it its pipes over that socket. Here the same program runs as a
plain process of this host (unisolated, so only for the protocol): what a container
adds is tested in ``test_docker.py``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bat_gym.core.sandbox import _supervisor, trees
from bat_gym.core.sandbox._supervisor_link import SupervisorLink, make_pipes

TIMEOUT_S = 10.0


class Linked:
    """A supervisor process started as the docker backend starts one, and its link."""

    def __init__(self, tmp: Path) -> None:
        self.ws, self.run = tmp / "ws", tmp / "run"
        for d in (self.ws, self.run, tmp / "tmp"):
            d.mkdir()
        self.call_fd = os.open(self.run / "call.sh", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        path = self.run / "link.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(TIMEOUT_S)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp / "tmp")}
        self.proc = subprocess.Popen(
            [sys.executable, "-s", _supervisor.__file__, "--connect", str(path)],
            start_new_session=True,
            env=env,
            cwd=self.ws,
        )
        with listener:
            conn, _ = listener.accept()
        path.unlink()
        cfg = {
            "workspace": str(self.ws),
            "tmp": str(tmp / "tmp"),
            "scratch": [],
            "call_file": str(self.run / "call.sh"),
            "pid_namespace": False,
            "bash": shutil.which("bash"),
            "trees": trees.__file__,
            "env": env,
            "preload": [],
            "site_dirs": [],
            "exec_filter": None,
            "rlimits": {},
        }
        ours, theirs = make_pipes()
        with conn:
            data = json.dumps(cfg).encode()
            socket.send_fds(conn, [struct.pack("!Q", len(data)) + data], theirs)
        for fd in theirs:
            os.close(fd)
        self.link = SupervisorLink(ours, self.call_fd, 4096)
        assert self.link.recv(TIMEOUT_S) == {"ready": True}

    def close(self) -> None:
        self.link.close()  # the supervisor sees its request pipe end, kills its calls, exits
        try:
            self.proc.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.call_fd)


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Linked]:
    box = Linked(tmp_path)
    yield box
    box.close()


def test_calls_go_over_the_handed_pipes(linked: Linked) -> None:
    link = linked.link
    r = link.exec_python(
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise SystemExit(3)", 5, 5
    )
    assert r is not None and (r["exit_code"], r["output"], r["timed_out"]) == (
        3,
        "out\nerr\n",
        False,
    )
    r = link.exec_bash("echo a; echo b >&2; exit 4", 5, 5)
    assert r is not None and (r["exit_code"], r["output"]) == (4, "a\nb\n")
    # Status lines and reply frames written as output stay output.
    frame = json.dumps({"exit_code": 0, "output": "", "output_bytes": 0, "duration_s": 0.0})
    r = link.exec_bash(
        f"for n in $(seq 1 50); do echo \"$n 0\"; done; echo '{frame}'; exit 6", 5, 5
    )
    assert r is not None and r["exit_code"] == 6 and r["output"].endswith(frame + "\n")
    r = link.exec_bash("sleep 30", 0.5, 1)
    assert r is not None and r["timed_out"] and r["exit_code"] is None
    assert link.ok("reset") and link.ok("ping")
    r = link.exec_bash("echo fine", 5, 5)
    assert r is not None and r["output"] == "fine\n"


def test_a_supervisor_with_a_lowered_limit_stops_at_its_next_request(linked: Linked) -> None:
    # A process of the same uid may lower another's limits; the change would outlast
    # every reset, so the supervisor stops and the host must start a fresh one.
    soft, hard = resource.prlimit(linked.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(linked.proc.pid, resource.RLIMIT_NOFILE, (64, min(hard, 64)))
    assert linked.link.exec_python("print(1)", 5, 5) is None
    assert linked.link.broken
    assert linked.proc.wait(TIMEOUT_S) == 0


def test_a_reply_that_never_comes_breaks_the_link_for_good(linked: Linked) -> None:
    os.kill(linked.proc.pid, signal.SIGSTOP)
    try:
        assert linked.link.call({"op": "ping"}, 0.3) is None
    finally:
        os.kill(linked.proc.pid, signal.SIGCONT)
    # Its late reply is now in the pipe: nothing is asked again, so it answers nothing.
    assert linked.link.broken
    assert linked.link.call({"op": "ping"}, TIMEOUT_S) is None
