"""Execution provenance: each sandbox records what a call ran and read, from outside the agent.

Every test runs on both backends; each fact (exec path and argv, exit status, reads)
is checked against a call whose effect is known, and against agent code that tries
to hide or forge it.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from bat_gym.core.sandbox import Sandbox, SandboxLimits, make_sandbox
from bat_gym.core.sandbox.exec_trace import MAX_ARGV_BYTES, MAX_RUNS

LIMITS = SandboxLimits(timeout_s=30)


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def sb(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    kwargs: dict[str, Any] = {"limits": LIMITS}
    if request.param == "docker":
        kwargs["client"] = request.getfixturevalue("docker_client")
    box = make_sandbox(request.param, **kwargs)
    assert "runs" in box.observes and "reads" in box.observes, box.observe_note
    yield box
    box.close()


def runs(sb: Sandbox, code: str, language: str = "bash") -> list:
    res = sb.execute_code(language, code)
    assert res.provenance.runs is not None, sb.observe_note
    return list(res.provenance.runs)


def test_a_builtin_runs_no_program(sb: Sandbox) -> None:
    assert runs(sb, "true; echo hi") == []


def test_exec_path_argv_cwd_and_exit_status(sb: Sandbox) -> None:
    (sb.workspace / "sub").mkdir(exist_ok=True)
    got = runs(sb, "cd sub && python3 -c 'import sys; sys.exit(3)' extra; ls /")
    assert [r.argv for r in got] == [
        ["python3", "-c", "import sys; sys.exit(3)", "extra"],
        ["ls", "/"],
    ]
    py, ls = got
    assert py.path.endswith("/python3") and py.exit_code == 3
    assert py.cwd.endswith("/sub")
    assert ls.path == "/usr/bin/ls" and ls.exit_code == 0


def test_python_calls_record_what_they_start(sb: Sandbox) -> None:
    code = "import subprocess; subprocess.run(['sh', '-c', 'exit 5'])"
    got = runs(sb, code, "python")
    # A PATH search tries several directories: only the program that ran is recorded.
    shells = [r for r in got if r.argv == ["sh", "-c", "exit 5"]]
    assert len(shells) == 1 and shells[0].exit_code == 5 and not shells[0].replaced


def test_a_killed_leftover_records_its_signal(sb: Sandbox) -> None:
    # The call waits (with builtins only, which run no program) until the leftover has
    # become `sleep`: killed while still a fork of the shell, it would have run nothing.
    wait_for_exec = "until read -r -d '' arg < /proc/$!/cmdline; [[ $arg == sleep ]]; do :; done"
    got = runs(sb, f"sleep 30 & {wait_for_exec}")
    assert [(r.argv, r.exit_code) for r in got] == [(["sleep", "30"], -9)]


def test_exec_in_place_replaces_the_earlier_program(sb: Sandbox) -> None:
    got = runs(sb, "sh -c 'exec /bin/echo replaced'")
    assert [r.argv[0] for r in got] == ["sh", "/bin/echo"]
    assert got[0].replaced and got[0].exit_code is None
    assert got[1].exit_code == 0 and got[0].pid == got[1].pid


def test_the_record_is_capped_and_counts_what_it_dropped(sb: Sandbox) -> None:
    res = sb.execute_code("bash", f"for i in $(seq {MAX_RUNS + 20}); do /bin/true; done")
    assert res.exit_code == 0
    assert len(res.provenance.runs or ()) == MAX_RUNS
    assert res.provenance.runs_dropped == 21  # seq, then MAX_RUNS + 20 true, less the cap


def test_argv_is_capped(sb: Sandbox) -> None:
    (run,) = runs(sb, "/bin/true " + " ".join(["x" * 1000] * 20))
    assert sum(len(a) + 1 for a in run.argv) <= MAX_ARGV_BYTES + 1


def test_an_exec_with_a_bad_pointer_is_answered_not_hung(sb: Sandbox) -> None:
    code = textwrap.dedent(
        """
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        nr = {"x86_64": 59, "aarch64": 221}[__import__("os").uname().machine]
        # A path pointer into unmapped memory: the kernel answers EFAULT.
        print(libc.syscall(nr, ctypes.c_void_p(8), ctypes.c_void_p(0), ctypes.c_void_p(0)), ctypes.get_errno())
        """
    )
    res = sb.execute_code("python", code)
    assert res.exit_code == 0 and res.output.split()[:2] == ["-1", str(14)]  # EFAULT
    assert res.provenance.runs == ()
    assert runs(sb, "/bin/true")[0].exit_code == 0  # the tracer still answers


def test_threads_exec_concurrently(sb: Sandbox) -> None:
    code = textwrap.dedent(
        """
        import subprocess, threading
        ts = [threading.Thread(target=subprocess.run, args=(["/bin/echo", str(i)],)) for i in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        """
    )
    got = runs(sb, code, "python")
    assert sorted(r.argv[1] for r in got if r.argv[:1] == ["/bin/echo"]) == [
        str(i) for i in range(8)
    ]


def test_agent_code_holds_no_listener(sb: Sandbox) -> None:
    res = sb.execute_code(
        "bash", "for f in /proc/self/fd/*; do readlink $f; done; ls /proc/1/fd 2>&1 | head -1"
    )
    assert "seccomp" not in res.output


def test_reads_are_the_files_the_call_opened(sb: Sandbox) -> None:
    (sb.workspace / "data").mkdir(exist_ok=True)
    (sb.workspace / "data" / "a.txt").write_text("a")
    (sb.workspace / "b.txt").write_text("b")
    (sb.workspace / "unread.txt").write_text("c")
    sb.digest()  # a scan watches the new directory, as the env's scan before each call does
    res = sb.execute_code("bash", "cat data/a.txt b.txt > /dev/null; echo new > c.txt")
    assert res.provenance.reads == ("b.txt", "data/a.txt")
    # The host's own reads (hashing what changed) belong to no call.
    sb.digest()
    assert sb.execute_code("bash", "true").provenance.reads == ()


def test_recording_holds_no_descriptor_past_its_call(sb: Sandbox) -> None:
    import os

    def count() -> int:  # pidfds and listeners; the engine client pools its sockets
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                n += os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:")
        return n

    # A PATH search (three missing candidates first) and a run, many times over.
    code = "import subprocess; subprocess.run(['true'])"
    sb.execute_code("python", code)
    before = count()
    for _ in range(40):
        sb.execute_code("python", code)
        sb.execute_code("bash", "/bin/true; true")
    assert count() <= before + 2


def test_agent_code_cannot_take_its_childrens_execs_with_a_listener_of_its_own(sb: Sandbox) -> None:
    # The kernel notifies the newest listener: one of the agent's would hide its execs.
    code = textwrap.dedent(
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)  # no_new_privs
        prog = (ctypes.c_ubyte * 8).from_buffer_copy(bytes.fromhex("0600000000007fc0"))  # ret USER_NOTIF
        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
        fp = Fprog(1, ctypes.cast(prog, ctypes.c_void_p))
        nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
        libc.syscall.restype = ctypes.c_long
        print(libc.syscall(nr, 1, 8, ctypes.byref(fp)), ctypes.get_errno())
        """
    )
    res = sb.execute_code("python", code)
    assert res.output.split()[:2] == ["-1", "1"], res.output  # EPERM
    assert [r.argv for r in runs(sb, "/bin/echo seen")] == [["/bin/echo", "seen"]]


def test_a_link_to_a_program_only_the_sandbox_has_is_recorded(sb: Sandbox) -> None:
    # An absolute target resolves inside the sandbox (its private /tmp), not on the host.
    code = "cp /bin/true /tmp/bat-only-here && ln -sf /tmp/bat-only-here ./p && ./p; rm -f ./p"
    assert ["./p"] in [r.argv for r in runs(sb, code)]
