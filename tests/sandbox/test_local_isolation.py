"""What agent code in a ``local`` sandbox cannot do, and that the sandbox survives it.

Every test ends by running ``echo ok`` in the same sandbox: containment that leaves
the sandbox unusable would fail an episode as surely as an escape.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import bat_gym
from bat_gym.core.sandbox import SandboxLimits, make_sandbox
from bat_gym.core.sandbox.base import Isolation, Sandbox
from bat_gym.core.sandbox.local import detect_isolation

LIMITS = SandboxLimits(timeout_s=3, memory_mb=256, max_processes=32, record_output_bytes=4096)


def isolated_box(**kwargs: object) -> Iterator[Sandbox]:
    best, why = detect_isolation()
    if best is not Isolation.BWRAP:
        pytest.skip(f"no bubblewrap isolation here: {why}")
    box = make_sandbox("local", limits=LIMITS, **kwargs)
    yield box
    box.close()


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    yield from isolated_box()


@pytest.fixture(scope="module")
def uncapped() -> Iterator[Sandbox]:
    """A sandbox without cgroup caps, where background jobs outlive their call."""
    yield from isolated_box(caps="none")


@pytest.fixture
def fresh() -> Iterator[Sandbox]:
    """A sandbox of its own, for tests that end its supervisor."""
    yield from isolated_box()


def assert_still_works(sb: Sandbox) -> None:
    r = sb.execute_code("bash", "echo ok")
    assert (r.exit_code, r.output, r.restarted) == (0, "ok\n", False)


def bash(sb: Sandbox, code: str, timeout_s: float | None = None) -> str:
    """Run bash code that must finish by itself; return its output."""
    r = sb.execute_code("bash", code, timeout_s)
    assert not r.timed_out and not r.restarted, r
    return r.output


def ns_processes(pid_ns: str) -> list[tuple[int, str, bytes]]:
    """(pid, state, cmdline) of every process on the host in the given PID namespace."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != pid_ns:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0].decode()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        out.append((int(name), state, cmdline))
    return out


@pytest.fixture
def host_secret() -> Iterator[Path]:
    """A root-only file in a fresh directory under the host's /tmp."""
    d = Path(tempfile.mkdtemp(prefix="bat_gym_secret_", dir="/tmp"))
    d.chmod(0o755)
    secret = d / "secret.txt"
    secret.write_text("TOP-SECRET-d41d8cd9\n")
    secret.chmod(0o600)
    yield secret
    secret.unlink()
    d.rmdir()


def test_private_host_files_are_invisible(sb: Sandbox, host_secret: Path) -> None:
    out = bash(
        sb,
        f"""
        test -e {host_secret} && echo "SEES {host_secret}"
        test -e {host_secret.parent} && echo "SEES {host_secret.parent}"
        cat {host_secret} 2>&1
        test -e {sb.store.root} && echo "SEES the blob store"
        test -e {Path(bat_gym.__file__).parent} && echo "SEES bat_gym's source"
        """,
    )
    assert "SEES" not in out
    assert "TOP-SECRET" not in out
    assert "No such file or directory" in out
    r = sb.execute_code("python", f"open({str(host_secret)!r}).read()")
    assert r.exit_code == 1 and "FileNotFoundError" in r.output

    # /root is there only as the path to the bound Python installation, if at all.
    listed = set(bash(sb, "ls -A /root 2>/dev/null").split())
    allowed = {
        Path(p).relative_to("/root").parts[0]
        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
        if Path(p).is_relative_to("/root")
    }
    assert listed <= allowed
    for name in set(os.listdir("/root")) - allowed:
        assert bash(sb, f"cat /root/{name} >/dev/null 2>&1 || echo denied") == "denied\n"
    assert_still_works(sb)


def test_writes_outside_the_workspace_fail(sb: Sandbox, tmp_path: Path) -> None:
    tmp_path.chmod(0o777)  # writable by anyone on the host: only the sandbox stops it
    probe = f"bat_gym_probe_{uuid.uuid4().hex}"
    targets = [
        f"/usr/{probe}",
        f"/usr/bin/{probe}",
        f"/etc/{probe}",
        "/etc/passwd",
        f"/{probe}",
        f"/opt/bat/{probe}",
        "/opt/bat/supervisor.code",  # what a restarted supervisor would run
        "/opt/bat/trees.code",
        "/run/bat/call.sh",
        f"{sys.prefix}/{probe}",
        f"{tmp_path}/{probe}",
    ]
    code = "".join(
        f'if {{ echo x > "{t}"; }} 2>/dev/null; then echo "wrote {t}"; else echo denied; fi\n'
        for t in targets
    )
    assert bash(sb, code) == "denied\n" * len(targets)
    assert list(tmp_path.iterdir()) == []
    assert not Path(f"/usr/{probe}").exists() and not Path(f"/{probe}").exists()

    out = bash(sb, f"echo in > /workspace/{probe} && echo in > /tmp/{probe} && cat /tmp/{probe}")
    assert out == "in\n"
    assert (sb.workspace / probe).read_text() == "in\n"
    assert not Path(f"/tmp/{probe}").exists()  # the sandbox's /tmp is its own
    (sb.workspace / probe).unlink()
    assert_still_works(sb)


NET = """
import socket
for addr in [("1.1.1.1", 80), ("127.0.0.1", {port})]:
    try:
        socket.create_connection(addr, timeout=2).close()
        print("connected", addr)
    except OSError as exc:
        print("refused", addr[0], type(exc).__name__)
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect({abstract!r})
    print("connected abstract")
except OSError as exc:
    print("refused abstract", type(exc).__name__)
"""


def test_network_is_unreachable(sb: Sandbox) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    abstract = f"\0bat_gym_test_{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(abstract)
    unix.listen()
    unix.setblocking(False)
    try:
        port = server.getsockname()[1]
        r = sb.execute_code("python", NET.format(port=port, abstract=abstract))
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert [line.split()[:2] for line in lines] == [
            ["refused", "1.1.1.1"],
            ["refused", "127.0.0.1"],
            ["refused", "abstract"],
        ]
        for listener in (server, unix):
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        server.close()
        unix.close()
    assert "refused" in bash(sb, "getent hosts pypi.org >/dev/null || echo refused")
    assert_still_works(sb)


def test_fork_bomb_is_contained_by_the_process_limit(sb: Sandbox) -> None:
    pid_ns = bash(sb, "readlink /proc/self/ns/pid").strip()
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, len(ns_processes(pid_ns)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # The bomb's own call stays (a builtin loop, which needs no fork) until the
        # deadline, which kills every process in the sandbox.
        r = sb.execute_code("bash", ":(){ :|:& };:; while :; do :; done")
        assert r.timed_out and r.exit_code is None
        assert "Resource temporarily unavailable" in r.output
        assert len(ns_processes(pid_ns)) <= 3  # supervisor, bash server, waiting subshell
        assert_still_works(sb)

        # The classic form returns at once and leaves the bomb running in the
        # background, holding every process slot until a call times out (or the
        # sandbox is reset), which kills it like any other background job.
        assert sb.execute_code("bash", ":(){ :|:& };:").exit_code == 0
        r = sb.execute_code("bash", "while :; do :; done", timeout_s=1)
        assert r.timed_out and r.exit_code is None
        assert len(ns_processes(pid_ns)) <= 3
    finally:
        done.set()
        sampler.join()
    # Agent processes plus the supervisor (PID 1, which counts against the same limit).
    assert 0 < peak <= LIMITS.max_processes
    assert_still_works(sb)


def test_memory_hog_fails_with_memory_error(sb: Sandbox) -> None:
    hog = "x = bytearray(512 << 20)"  # twice the address-space limit
    r = sb.execute_code("python", hog)
    assert r.exit_code not in (0, None) and "MemoryError" in r.output
    r = sb.execute_code("bash", f'python -c "{hog}"')
    assert r.exit_code not in (0, None) and "MemoryError" in r.output
    assert_still_works(sb)


def test_endless_loop_times_out_and_kills_background_jobs(uncapped: Sandbox) -> None:
    sb = uncapped
    pid_ns = bash(sb, "readlink /proc/self/ns/pid").strip()
    bash(sb, "sleep 1000 & (sleep 1001 &) ; setsid sleep 1002 &")

    def sleeps() -> list[bytes]:
        return [c for _, _, c in ns_processes(pid_ns) if c.startswith(b"sleep\0")]

    deadline = time.monotonic() + 2
    while len(sleeps()) < 3 and time.monotonic() < deadline:  # they start after the call
        time.sleep(0.01)
    assert len(sleeps()) == 3

    start = time.monotonic()
    r = sb.execute_code("bash", "while :; do :; done", timeout_s=1)
    assert r.timed_out and r.exit_code is None
    assert 1 <= time.monotonic() - start < 3
    assert sleeps() == []

    r = sb.execute_code("python", "while True:\n    pass", timeout_s=1)
    assert r.timed_out and r.exit_code is None
    assert_still_works(sb)


def test_huge_output_is_capped_and_counted(sb: Sandbox) -> None:
    r = sb.execute_code("bash", "yes | head -c 50M; echo END")
    assert r.exit_code == 0
    assert r.output_bytes == (50 << 20) + 4
    # The record keeps the head and the tail (where errors land), and marks the cut.
    cut = f"\n[... {r.output_bytes - LIMITS.record_output_bytes} bytes of output cut ...]\n"
    head, marker, tail = r.output.partition(cut)
    assert marker and len(head) + len(tail) == LIMITS.record_output_bytes
    assert head.startswith("y\ny\n") and tail.endswith("y\nEND\n")
    r = sb.execute_code(
        "python", "import sys\nsys.stdout.write('z' * 20_000_000)\nraise SystemExit('boom')"
    )
    assert (r.exit_code, r.output_bytes) == (1, 20_000_005)
    assert r.output.endswith("zzz\nboom\n") or r.output.endswith("zzzboom\n")
    assert_still_works(sb)


FORGE = """
for fd in $(seq 3 20); do printf '0\\n' >&$fd; printf '%s 0\\n' {{1..50}} >&$fd; done 2>/dev/null
printf() { :; }; exit() { :; }; read() { :; }; ulimit() { :; }; trap '' EXIT
false
"""


def test_agent_code_cannot_forge_results(sb: Sandbox) -> None:
    r = sb.execute_code("bash", FORGE)
    assert r.exit_code == 1  # the status of `false`, the last command
    for code, want in (("exit 7", 7), ("true", 0), ("exit 3", 3)):
        assert sb.execute_code("bash", code).exit_code == want

    r = sb.execute_code(
        "python",
        "import os\nfor fd in range(3, 21):\n"
        "    try:\n        os.write(fd, b'0\\n')\n    except OSError:\n        pass\n"
        "raise SystemExit(5)",
    )
    assert r.exit_code == 5
    assert sb.execute_code("bash", "exit 7").exit_code == 7


def test_killing_the_shell_is_reported_and_recovered(sb: Sandbox) -> None:
    r = sb.execute_code("bash", "kill -9 $$; sleep 2; echo not reached")
    assert r.exit_code == -9 and not r.restarted
    assert "not reached" not in r.output
    assert sb.execute_code("bash", "exit 7").exit_code == 7

    # $PPID is the supervisor, PID 1 of the sandbox: signals from inside never reach it.
    before = bash(sb, "readlink /proc/self/ns/pid")
    r = sb.execute_code("bash", "kill -9 $PPID; kill -STOP 1; kill -INT 1; echo alive")
    assert (r.output, r.restarted) == ("alive\n", False)
    r = sb.execute_code("python", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert (r.exit_code, r.restarted) == (0, False)
    assert bash(sb, "readlink /proc/self/ns/pid") == before  # the same sandbox, not a new one
    assert sb.execute_code("bash", "exit 7").exit_code == 7
    assert_still_works(sb)


def test_server_killed_between_calls_forges_nothing(sb: Sandbox) -> None:
    # A background job kills the bash server while no call runs; the status that
    # death leaves behind must not be taken for the next call's.
    bash(sb, "(sleep 0.2; kill -9 $$) >/dev/null 2>&1 &")
    time.sleep(0.6)
    for code, want in (("exit 7", 7), ("exit 8", 8), ("true", 0)):
        assert sb.execute_code("bash", code).exit_code == want
    assert_still_works(sb)


STOP_WAITING_SHELL = """
server=$$
( sleep 0.2; kill -STOP "$server" ) >/dev/null 2>&1 &
"""


def test_call_that_timed_out_before_starting_never_runs(uncapped: Sandbox) -> None:
    # Stopping the bash server while it waits for the next call makes that call time
    # out unread; it must not run later, nor shift later results by one.
    sb = uncapped
    bash(sb, STOP_WAITING_SHELL)
    time.sleep(0.6)
    r = sb.execute_code("bash", "echo ran >> /workspace/ran.txt; exit 5", timeout_s=1)
    assert r.timed_out and r.exit_code is None
    for code, want in (("exit 7", 7), ("echo second; exit 8", 8)):
        r = sb.execute_code("bash", code)
        assert r.exit_code == want
    assert r.output == "second\n"
    time.sleep(0.2)
    assert not (sb.workspace / "ran.txt").exists()
    assert_still_works(sb)


def test_agent_code_runs_unprivileged(sb: Sandbox) -> None:
    status = bash(sb, "id -u; grep -E '^Cap(Prm|Eff|Amb):' /proc/self/status").split()
    assert int(status[0]) != 0
    assert status[1:] == ["CapPrm:", "0" * 16, "CapEff:", "0" * 16, "CapAmb:", "0" * 16]
    r = sb.execute_code(
        "python",
        "import os\nprint(os.getuid(), os.geteuid())\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])",
    )
    uid, euid, cap_eff = r.output.split()
    assert int(uid) == int(euid) == int(status[0]) and cap_eff == "0" * 16
    assert_still_works(sb)


def test_supervisor_and_shell_cannot_be_inspected(sb: Sandbox) -> None:
    # PID 1 is the supervisor; $$ is the bash server. Both are non-dumpable.
    out = bash(
        sb,
        """
        for p in 1 $$; do
          test -d /proc/$p && echo "exists $p"
          for f in environ mem maps fd/0; do
            if head -c1 /proc/$p/$f >/dev/null 2>&1; then echo "read $p/$f"; fi
          done
          for d in root cwd fd; do
            if ls /proc/$p/$d/ >/dev/null 2>&1; then echo "listed $p/$d"; fi
          done
        done
        # Until it has exec'd, the child is a non-dumpable copy of the shell: wait for sleep.
        sleep 5 & until [ "$(cat /proc/$!/comm 2>/dev/null)" = sleep ]; do :; done
        head -c1 /proc/$!/environ >/dev/null && echo "control readable"; kill $!
        """,
    )
    # The same reads of an ordinary agent process succeed: what stops them is the
    # supervisor's and the server's non-dumpability, not a blanket restriction.
    assert [line.split()[0] for line in out.splitlines() if line.strip()] == [
        "exists",
        "exists",
        "control",
    ]
    r = sb.execute_code("python", "open('/proc/1/mem', 'rb').read(1)")
    assert r.exit_code == 1 and "PermissionError" in r.output
    assert_still_works(sb)


def test_bat_gym_is_not_importable_inside(sb: Sandbox) -> None:
    r = sb.execute_code("bash", 'python -c "import bat_gym"')
    assert r.exit_code == 1 and "ModuleNotFoundError" in r.output
    r = sb.execute_code("python", "import bat_gym")
    assert r.exit_code == 1 and "ModuleNotFoundError" in r.output
    assert_still_works(sb)


TAMPERS = [
    "resource.prlimit(1, resource.RLIMIT_NOFILE, (12, 12))",
    "resource.prlimit(1, resource.RLIMIT_CPU, (1, 1))",
    "os.setpriority(os.PRIO_PROCESS, 1, 19)",
    "os.sched_setaffinity(1, {min(os.sched_getaffinity(1))})",
]
SUPERVISOR_STATE = (
    "cat /proc/1/limits; cut -d' ' -f19 /proc/1/stat; grep Cpus_allowed: /proc/1/status"
)


# The PID namespace and when its init started (clock ticks since boot): the kernel may
# give a new namespace the inode number of one just freed.
SANDBOX_IDENTITY = "readlink /proc/self/ns/pid; awk '{print $22}' /proc/1/stat"


def tamper_with_pid_1(sb: Sandbox, tamper: str) -> None:
    if "affinity" in tamper and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no affinity to narrow")
    r = sb.execute_code("python", f"import os, resource\n{tamper}\nprint('done')")
    # Same uid suffices to change these of another process: the change itself works.
    assert (r.exit_code, r.output, r.restarted) == (0, "done\n", False), r


@pytest.mark.parametrize("tamper", TAMPERS)
def test_a_supervisor_whose_limits_agent_code_changed_is_replaced_at_reset(
    fresh: Sandbox, tamper: str
) -> None:
    # The change would outlive every reset; the supervisor notices at its next request
    # and stops without a reply, and the host starts a fresh sandbox.
    before = bash(fresh, SUPERVISOR_STATE)
    ns = bash(fresh, SANDBOX_IDENTITY)
    tamper_with_pid_1(fresh, tamper)
    assert bash(fresh, "echo fine") == "fine\n"  # a bash call sends no request
    fresh.restore(fresh.capture())
    assert bash(fresh, SUPERVISOR_STATE) == before
    assert bash(fresh, SANDBOX_IDENTITY) != ns  # a new sandbox, not the old one
    # The host's own nice value: the fresh supervisor's calls run at it again.
    r = fresh.execute_code("python", "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))")
    assert (r.exit_code, r.output, r.restarted) == (
        0,
        f"{os.getpriority(os.PRIO_PROCESS, 0)}\n",
        False,
    )


@pytest.mark.parametrize("tamper", TAMPERS)
def test_a_call_sent_to_a_tampered_supervisor_is_lost_never_forged(
    fresh: Sandbox, tamper: str
) -> None:
    before = bash(fresh, SUPERVISOR_STATE)
    tamper_with_pid_1(fresh, tamper)
    (fresh.workspace / "marker.txt").write_text("kept\n")
    # The next request is this call: the supervisor stops without running it.
    r = fresh.execute_code("python", "open('ran.txt', 'w').write('ran')\nprint('forged')")
    assert (r.exit_code, r.restarted) == (None, True), r
    assert "forged" not in r.output
    assert not (fresh.workspace / "ran.txt").exists()
    assert (fresh.workspace / "marker.txt").read_text() == "kept\n"  # the workspace stays
    assert bash(fresh, SUPERVISOR_STATE) == before
    r = fresh.execute_code("python", "print('fresh')")
    assert (r.exit_code, r.output, r.restarted) == (0, "fresh\n", False)
    assert_still_works(fresh)


def test_a_restarted_supervisor_imports_nothing_from_the_workspace(fresh: Sandbox) -> None:
    # A fresh supervisor starts in the workspace, which then holds whatever agent code
    # left there: a module of the same name as one it imports must not be loaded.
    names = ("json", "ctypes", "contextlib", "socket", "select", "signal", "marshal", "types")
    plant = "".join(
        f"open('{n}.py', 'w').write(\"open('/workspace/imported-{n}', 'w')\\n\")\n" for n in names
    )
    assert fresh.execute_code("python", plant).exit_code == 0
    tamper_with_pid_1(fresh, "os.setpriority(os.PRIO_PROCESS, 1, 19)")
    fresh.restore(fresh.capture())  # the supervisor stops; a new one starts in this workspace
    assert python_state_ok(fresh)
    assert not [p.name for p in fresh.workspace.glob("imported-*")]
    assert_still_works(fresh)


def python_state_ok(sb: Sandbox) -> bool:
    r = sb.execute_code("python", "import json\nprint(json.dumps([1]))")
    return (r.exit_code, r.output, r.restarted) == (0, "[1]\n", False)
