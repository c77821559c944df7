"""The process a ``local`` sandbox forks ahead for the next python call (its spare).

After each python call the supervisor forks the next call's process and sets it up,
off the clock; the call then only hands it its code. The spare is agent-reachable in
a few ways (same uid, same PID namespace), and none of them may carry into a later
call or a later episode: each test tampers as agent code could, then checks that the
next python call runs exactly as a fresh process would, and is never reported lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bat_gym.core.sandbox import SandboxLimits, make_sandbox
from bat_gym.core.sandbox.base import Isolation, Sandbox
from bat_gym.core.sandbox.local import detect_isolation

LIMITS = SandboxLimits(timeout_s=5, memory_mb=512, max_processes=32, record_output_bytes=8192)

# Run as a separate program from a bash call (never from a python call: the spare of
# that call is not forked until it ends). Prints the spare's pid.
FIND_SPARE = """python3 - <<'EOF'
import os, time
deadline = time.monotonic() + 5  # it is forked once the supervisor has been idle a moment
found = []
while not found and time.monotonic() < deadline:
    for name in os.listdir('/proc'):
        if name.isdigit() and name != '1':
            try:
                cmd = open(f'/proc/{name}/cmdline', 'rb').read()
            except OSError:
                continue
            if b'/opt/bat/supervisor' in cmd:
                found.append(name)
    time.sleep(0.01)
print(*found)
EOF"""

# What a python call sees of itself: every field a tamper could change.
SELF_STATE = (
    "import os, resource, sys\n"
    "print(sorted(os.listdir('/proc/self/fd')))\n"
    "print([resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource))"
    " if n.startswith('RLIMIT_') and n != 'RLIMIT_CPU'])\n"
    "print(os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))\n"
    "print(open('/proc/self/cgroup').read())\n"
    "print(open('/proc/self/status').read().split('SigBlk:')[1].split('\\n')[:4])\n"
)


@pytest.fixture
def sb() -> Iterator[Sandbox]:
    best, why = detect_isolation()
    if best is not Isolation.BWRAP:
        pytest.skip(f"no bubblewrap isolation here: {why}")
    box = make_sandbox("local", limits=LIMITS)
    yield box
    box.close()


def spare_pid(sb: Sandbox) -> int:
    """Run a python call (so a spare is forked after it), then find the spare."""
    r = sb.execute_code("python", "pass")
    assert r.exit_code == 0, r
    r = sb.execute_code("bash", FIND_SPARE)
    pids = r.output.split()
    assert len(pids) == 1, r.output  # exactly one spare waits after a python call
    return int(pids[0])


def python_ok(sb: Sandbox, code: str) -> str:
    r = sb.execute_code("python", code)
    assert (r.exit_code, r.restarted, r.timed_out) == (0, False, False), r
    return r.output


def test_python_calls_are_forked_ahead_and_start_fresh(sb: Sandbox) -> None:
    python_ok(sb, "pass")
    baseline = python_ok(sb, SELF_STATE)
    # Only the three standard descriptors (and the one listing the directory).
    assert baseline.splitlines()[0] == "['0', '1', '2', '3']"
    assert python_ok(sb, SELF_STATE) == baseline  # the next one, from the next spare
    # The same cgroups as a bash call: the spare joined the capped leaf before the code ran.
    bash_cg = sb.execute_code("bash", "cat /proc/self/cgroup").output
    assert f"{bash_cg}\n" in baseline


def test_module_state_of_one_call_reaches_no_later_call(sb: Sandbox) -> None:
    python_ok(
        sb,
        "import builtins, json, os, sys, numpy\n"
        "json.dumps = None\nbuiltins.leak = 1\nos.environ['LEAK'] = '1'\n"
        "sys.path.append('/leak')\nsys.modules['leak'] = sys\nnumpy.random.seed(0)\n"
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n",
    )
    out = python_ok(
        sb,
        "import builtins, json, os, sys, signal, numpy\n"
        "print(json.dumps is not None, hasattr(builtins, 'leak'), 'LEAK' in os.environ,"
        " '/leak' in sys.path, 'leak' in sys.modules,"
        " signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)\n"
        "numpy.random.seed(0); a = numpy.random.rand()\n",
    )
    assert out == "True False False False False True\n"
    # Each call's numpy stream is its own, not the stream of the process it came from.
    draws = {python_ok(sb, "import numpy\nprint(numpy.random.randint(1 << 30))") for _ in range(4)}
    assert len(draws) == 4


def test_the_spare_cannot_be_read_written_or_traced(sb: Sandbox) -> None:
    pid = spare_pid(sb)
    probe = f"""python3 - <<'EOF'
import ctypes, os
pid = {pid}
for f in ('mem', 'environ', 'maps', 'fd/0', 'fd/3'):
    try:
        open(f'/proc/{{pid}}/{{f}}', 'rb').read(1)
        print('read', f)
    except OSError:
        pass
try:
    os.listdir(f'/proc/{{pid}}/fd')
    print('listed fd')
except OSError:
    pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
    print('attached')
try:
    pidfd = os.pidfd_open(pid)
    if libc.syscall(438, pidfd, 3, 0) >= 0:  # pidfd_getfd: its code pipe
        print('took fd')
except OSError:
    pass
print('done')
EOF"""
    r = sb.execute_code("bash", probe)
    assert r.output == "done\n", r.output
    python_ok(sb, "pass")


TAMPERS = {
    "killed": "kill -KILL {pid}",
    "interrupted": "kill -INT {pid}",
    "stopped": "kill -STOP {pid}",
    "nofile lowered": "prlimit --pid {pid} --nofile=12:12",
    "cpu lowered": "prlimit --pid {pid} --cpu=1:1",
    "as lowered": "prlimit --pid {pid} --as=100000000:100000000",
    "reniced": "renice -n 19 -p {pid} >/dev/null",
    "pinned": "taskset -p -c 0 {pid} >/dev/null",
}


@pytest.mark.parametrize("how", list(TAMPERS))
def test_a_tampered_spare_is_never_used(sb: Sandbox, how: str) -> None:
    if how == "pinned" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no affinity to narrow")
    python_ok(sb, "pass")
    baseline = python_ok(sb, SELF_STATE)
    pid = spare_pid(sb)
    r = sb.execute_code("bash", TAMPERS[how].format(pid=pid) + " && echo tampered")
    assert r.output == "tampered\n", r.output
    # The call the spare was forked for runs as a fresh process would, in time.
    r = sb.execute_code("python", SELF_STATE, timeout_s=3)
    assert (r.exit_code, r.restarted, r.timed_out) == (0, False, False), r
    assert r.output == baseline
    assert python_ok(sb, "print(1 + 1)") == "2\n"


def test_a_reset_discards_the_spare(sb: Sandbox) -> None:
    pid = spare_pid(sb)
    sb.restore(sb.capture())
    r = sb.execute_code("bash", f"test -d /proc/{pid} && echo alive; echo checked")
    assert r.output == "checked\n"
    assert python_ok(sb, "print('after')") == "after\n"
