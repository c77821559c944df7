"""The ``docker`` sandbox backend against a real engine.

Every test skips, with the reason, where the Docker SDK is missing, no engine answers
or the base image cannot be had (``.ci/docker-setup.sh`` sets all three up).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bat_gym.core.errors import SandboxCrashed
from bat_gym.core.sandbox import SandboxLimits, WorkspaceIndex, make_sandbox

pytestmark = pytest.mark.docker

# Small limits keep the containment tests fast; 256 MiB is what the memory test needs.
LIMITS = SandboxLimits(
    timeout_s=30, total_memory_mb=256, max_processes=64, record_output_bytes=4096, tmp_mb=64
)


@pytest.fixture(scope="module", autouse=True)
def engine(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The live engine (or a skip), with a runtime directory of this module's own.

    Slots are shared with every other sandbox of this uid, and one released here may be
    taken at once by another process.
    """
    client = docker_client
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BAT_GYM_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
        yield client


@pytest.fixture
def sb(engine: Any) -> Iterator[Any]:
    sandbox = make_sandbox("docker", limits=LIMITS, client=engine)
    yield sandbox
    sandbox.close()


def _containers(engine: Any, cid: str) -> list:
    return engine.containers.list(all=True, filters={"id": cid})


def test_python_and_bash_report_exit_codes_and_interleaved_output(sb: Any) -> None:
    r = sb.execute_code("python", "import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    assert (r.exit_code, r.output, r.timed_out, r.restarted) == (0, "out\nerr\n", False, False)
    r = sb.execute_code("python", "raise SystemExit(3)")
    assert r.exit_code == 3
    r = sb.execute_code("python", "1/0")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.output
    r = sb.execute_code("bash", "echo a; echo b >&2; echo c; exit 4")
    assert (r.exit_code, r.output, r.output_bytes) == (4, "a\nb\nc\n", 6)
    r = sb.execute_code("bash", "id -u; pwd")
    assert r.ok and r.output.split() == [str(sb._uid), "/workspace"]
    r = sb.execute_code("python", "import numpy; print(numpy.arange(3).sum())")
    assert (r.exit_code, r.output) == (0, "3\n")
    with pytest.raises(ValueError):
        sb.execute_code("ruby", "puts 1")


def test_files_persist_across_calls(sb: Any) -> None:
    assert sb.execute_code("python", "open('note.txt', 'w').write('kept')").ok
    r = sb.execute_code("bash", "cat note.txt")
    assert (r.exit_code, r.output) == (0, "kept")
    assert (sb.workspace / "note.txt").read_text() == "kept"
    # Code past the kernel's single-argument limit goes through a file instead.
    r = sb.execute_code("python", "x = '" + "y" * 200_000 + "'\nprint(len(x))")
    assert (r.exit_code, r.output) == (0, "200000\n")


def test_root_filesystem_is_read_only_and_network_absent(sb: Any) -> None:
    r = sb.execute_code("bash", "touch /etc/x || touch /x || echo refused")
    assert "refused" in r.output
    code = "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
    code += "except OSError as e:\n    print('blocked', e)\nelse:\n    print('connected')\n"
    r = sb.execute_code("python", code)
    assert r.ok and r.output.startswith("blocked"), r.output
    r = sb.execute_code("bash", "ls /sys/class/net")
    assert r.output.split() == ["lo"]


def test_memory_limit_is_contained(sb: Any) -> None:
    r = sb.execute_code("python", "x = b'\\x01' * (2 << 30)\nprint('allocated')")
    assert r.exit_code != 0 and "allocated" not in r.output
    assert not r.restarted
    assert sb.execute_code("bash", "echo fine").output == "fine\n"


def test_fork_bomb_is_contained(sb: Any) -> None:
    r = sb.execute_code("bash", ":(){ :|:& };:; sleep 60", timeout_s=2)
    assert r.timed_out and r.exit_code is None
    assert "Resource temporarily unavailable" in r.output  # the pid limit stopped it
    r = sb.execute_code("bash", "echo fine")
    assert (r.exit_code, r.output) == (0, "fine\n")
    # A bomb that returns at once keeps running in the background until a reset.
    sb.execute_code("bash", ":(){ :|:& };:")
    sb.restore(sb.capture())
    assert sb.execute_code("bash", "echo fine").output == "fine\n"


def test_endless_loop_times_out_and_the_sandbox_stays_usable(sb: Any) -> None:
    start = time.monotonic()
    r = sb.execute_code("python", "print('started', flush=True)\nwhile True: pass", timeout_s=1)
    assert r.timed_out and r.exit_code is None and not r.restarted
    assert r.output.startswith("started\n") and "timed out after 1 s" in r.output
    assert time.monotonic() - start < 5
    r = sb.execute_code("bash", "echo fine")
    assert (r.exit_code, r.output) == (0, "fine\n")


def test_background_process_does_not_hold_the_call(sb: Any) -> None:
    r = sb.execute_code("bash", "sleep 30 & echo started")
    assert r.exit_code == 0 and r.output.startswith("started\n")
    assert "stopped" in r.output  # and it does not outlive the call either
    assert r.duration_s < 1.5


def test_huge_output_is_capped_and_counted(sb: Any) -> None:
    r = sb.execute_code("bash", "yes | head -c 20000000; echo END")
    assert r.ok and r.output_bytes == 20_000_004
    head, marker, tail = r.output.partition(
        f"\n[... {20_000_004 - LIMITS.record_output_bytes} bytes of output cut ...]\n"
    )
    assert marker and len(head) + len(tail) == LIMITS.record_output_bytes
    assert head.startswith("y\ny\n") and tail.endswith("y\nEND\n")


def test_restore_after_edits_is_exact(sb: Any) -> None:
    setup = "mkdir -p src/pkg data && echo 'print(1)' > src/pkg/a.py && echo x > data/b"
    setup += " && chmod 640 data/b && ln -s pkg/a.py src/link && echo k > keep.txt"
    assert sb.execute_code("bash", setup).ok
    snap = sb.capture()
    edits = "echo changed > src/pkg/a.py; rm -r data; ln -sf /etc/passwd src/link;"
    edits += " mkdir -p new/deep && echo n > new/deep/f; chmod 700 src; echo t > /tmp/junk;"
    edits += " sleep 300 >/dev/null 2>&1 &"
    assert sb.execute_code("bash", edits).ok
    assert sb.digest() != snap.digest
    sb.restore(snap)
    assert WorkspaceIndex(sb.workspace).scan().digest == snap.digest
    assert sb.digest() == snap.digest
    # Every process the agent left is gone and /tmp is empty.
    check = "ls -A /tmp; for p in /proc/[0-9]*; do grep -q '^Name:.*sleep' $p/status"
    check += ' && grep -q "^Uid:.$(id -u)" $p/status && echo left $p; done; true'
    r = sb.execute_code("bash", check)
    assert (r.exit_code, r.output) == (0, ""), r.output


def test_agent_can_overwrite_restored_files(sb: Any) -> None:
    assert sb.execute_code("bash", "mkdir d && echo one > d/f && echo one > g").ok
    snap = sb.capture()
    assert sb.execute_code("bash", "rm -r d; echo two > g").ok
    sb.restore(snap)
    r = sb.execute_code("bash", "echo three > d/f && echo three > g && touch d/new && cat d/f g")
    assert (r.exit_code, r.output) == (0, "three\nthree\n"), r.output


def test_a_dead_container_is_restarted_not_guessed(sb: Any, engine: Any) -> None:
    assert sb.execute_code("bash", "echo kept > f").ok
    engine.api.kill(sb.container_id)
    r = sb.execute_code("bash", "echo hello")
    assert r.restarted and r.exit_code is None
    r = sb.execute_code("bash", "cat f")
    assert (r.exit_code, r.output, r.restarted) == (0, "kept\n", False)


def test_close_leaves_no_container_and_no_workspace(engine: Any) -> None:
    sandbox = make_sandbox("docker", limits=LIMITS, client=engine)
    cid, ws = sandbox.container_id, sandbox.workspace
    assert _containers(engine, cid) and ws.is_dir()
    sandbox.close()
    sandbox.close()  # twice is fine
    assert _containers(engine, cid) == []
    assert not ws.exists()
    with pytest.raises(SandboxCrashed):
        sandbox.execute_code("bash", "true")
    # Garbage collection cleans up just the same.
    sandbox = make_sandbox("docker", limits=LIMITS, client=engine)
    cid, ws = sandbox.container_id, sandbox.workspace
    del sandbox
    gc.collect()
    assert _containers(engine, cid) == []
    assert not ws.exists()


# -- the supervisor link: what agent code cannot do to a result --------------------------
#
# Every call below is what an adversarial policy would try. Each must end as its own
# honest result, a timeout or a restart (``restarted``, no exit code), never as a
# result the code chose and never as an exception on the host.

# Writes what the host reads as a bash status line ("SEQ STATUS") for every tag a call
# could have, and a python reply frame, to every descriptor of every process it can
# open: its own stdout and stderr take them as plain output; no other process's open.
_FORGE_EVERY_FD = r"""
import glob, json, os, struct
frame = json.dumps({"exit_code": 0, "output": "forged", "output_bytes": 6,
                    "duration_s": 0.0, "timed_out": False}).encode()
lines = b"".join(b"%d 0\n" % n for n in range(1, 200))
payload = struct.pack("!Q", len(frame)) + frame + lines
opened = []
for path in glob.glob("/proc/[0-9]*/fd/*"):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(fd, payload)
        opened.append(path)
    except OSError:
        pass
    finally:
        os.close(fd)
print("OTHER", sorted(p for p in opened if not p.startswith(f"/proc/{os.getpid()}/")))
raise SystemExit(7)
"""


# How many `sleep` processes run in the container (the image has no ps).
_COUNT_SLEEPS = "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$'; true"


def _supervisor_pid(engine: Any, sb: Any) -> int:
    return int(engine.api.inspect_container(sb.container_id)["State"]["Pid"])


def test_fake_frames_and_status_lines_are_only_output(sb: Any) -> None:
    r = sb.execute_code("python", _FORGE_EVERY_FD)
    assert r.exit_code == 7 and not r.restarted, r.output
    assert "OTHER []" in r.output  # no descriptor but its own output could be opened
    # The same from bash, and from a python process that bash starts.
    seqs = 'for n in $(seq 1 200); do echo "$n 0"; echo "$n 0" >&2; done'
    r = sb.execute_code("bash", f"{seqs}; exit 9")
    assert r.exit_code == 9 and not r.restarted
    (sb.workspace / "forge.py").write_text(_FORGE_EVERY_FD)
    r = sb.execute_code("bash", "python3 forge.py; exit $(( $? + 1 ))")
    assert r.exit_code == 8 and "OTHER []" in r.output, r.output
    assert sb.execute_code("bash", "echo fine").output == "fine\n"


def test_the_link_is_out_of_reach(sb: Any) -> None:
    # The socket the supervisor connected through is gone; the copy of bash the server
    # runs cannot be read (so the server is not dumpable); the supervisor's and the
    # server's descriptors cannot be listed.
    check = (
        "ls -A /run/bat; cat /run/bat/bash >/dev/null 2>&1 && echo READ;"
        " ls /proc/1/fd >/dev/null 2>&1 && echo FDS1;"
        " ls /proc/$PPID/fd >/dev/null 2>&1 && echo FDS-SERVER; true"
    )
    r = sb.execute_code("bash", check)
    listed = r.output.split()
    assert "link.sock" not in listed and "supervisor.py" in listed, r.output
    assert not {"READ", "FDS1", "FDS-SERVER"} & set(listed), r.output
    code = "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
    code += "    s.connect('/run/bat/link.sock')\nexcept OSError:\n    print('refused')\n"
    assert sb.execute_code("python", code).output == "refused\n"


def test_killing_the_supervisor_from_inside_does_nothing(sb: Any) -> None:
    r = sb.execute_code("bash", "kill -9 1; kill -STOP 1; kill -TERM 1; echo alive; exit 5")
    assert (r.exit_code, r.output, r.restarted) == (5, "alive\n", False)
    r = sb.execute_code("python", "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('alive')")
    assert (r.exit_code, r.output, r.restarted) == (0, "alive\n", False)
    # Killing every process it may signal (all but itself and init) kills the shell
    # server its call runs under: reported as such, and the server comes back.
    r = sb.execute_code("bash", "kill -9 -1; echo after")
    assert (r.exit_code, r.restarted) == (-9, False)
    assert r.output == "after\n\n[the shell running this call was killed]\n"
    r = sb.execute_code("python", "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('after')")
    assert (r.exit_code, r.output, r.restarted) == (0, "after\n", False)
    assert sb.execute_code("bash", "echo fine").output == "fine\n"


def test_closed_descriptors_end_a_call_cleanly(sb: Any) -> None:
    r = sb.execute_code("bash", "echo before; exec 1>&- 2>&- 0<&-; exit 4")
    assert (r.exit_code, r.output, r.restarted) == (4, "before\n", False)
    r = sb.execute_code(
        "python", "import os\nprint('before', flush=True)\nos.closerange(0, 1024)\nos._exit(3)"
    )
    assert (r.exit_code, r.output, r.restarted) == (3, "before\n", False)
    assert sb.execute_code("bash", "echo fine").output == "fine\n"


def test_a_child_that_outlives_its_call_cannot_touch_the_next(sb: Any) -> None:
    # Detached from the shell and the session, writing as fast as it can.
    r = sb.execute_code(
        "bash",
        "setsid nohup sh -c 'while :; do echo FORGED; echo \"2 0\" >&2; done' & echo started",
    )
    assert r.ok and r.output.startswith("started\n") and "stopped" in r.output
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n"
    code += "        try:\n            os.write(1, b'FORGED\\n')\n        except OSError:\n"
    code += "            pass\n        time.sleep(0.001)\nprint('parent')"
    r = sb.execute_code("python", code)
    assert r.ok and r.output.startswith("parent\n") and "stopped" in r.output
    for _ in range(3):
        r = sb.execute_code("bash", "sleep 0.05; echo next")
        assert (r.exit_code, r.output) == (0, "next\n")


def test_a_call_past_its_timeout_is_killed_with_its_children(sb: Any) -> None:
    for language, code in (
        ("bash", "sleep 100 & echo started; sleep 100"),
        (
            "python",
            "import subprocess, time\nprint('started', flush=True)\n"
            "subprocess.Popen(['sleep', '100'])\ntime.sleep(100)",
        ),
    ):
        start = time.monotonic()
        r = sb.execute_code(language, code, timeout_s=1)
        assert r.timed_out and r.exit_code is None and not r.restarted, r
        assert r.output.startswith("started\n") and time.monotonic() - start < 5
        r = sb.execute_code("bash", _COUNT_SLEEPS)
        assert r.output == "0\n", r.output


def test_a_lost_reply_restarts_the_container_and_is_reported_lost(sb: Any, engine: Any) -> None:
    assert sb.execute_code("bash", "echo kept > f").ok
    for language, code in (("python", "import time\ntime.sleep(30)"), ("bash", "sleep 30")):
        pid = _supervisor_pid(engine, sb)  # what the OOM killer or the engine could do
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        r = sb.execute_code(language, code, timeout_s=20)
        assert r.restarted and r.exit_code is None and r.output_bytes == 0, r
        assert _supervisor_pid(engine, sb) != pid
        r = sb.execute_code("bash", "cat f")
        assert (r.exit_code, r.output, r.restarted) == (0, "kept\n", False)


def test_reset_is_warm_and_clears_scratch_space(sb: Any, engine: Any) -> None:
    snap = sb.capture()
    started = engine.api.inspect_container(sb.container_id)["State"]["StartedAt"]
    dirty = "echo t > /tmp/a; mkdir -p /tmp/d/e; echo s > /dev/shm/s; ipcmk -M 4096 >/dev/null;"
    dirty += " ipcmk -Q >/dev/null; echo w > w.txt; sleep 300 >/dev/null 2>&1 &"
    assert sb.execute_code("bash", dirty).ok
    check = "ls -A /tmp; echo /; ls -A /dev/shm; echo /; ipcs -m -q | grep -c '^0x';"
    check += " test -e w.txt && echo w.txt; true"
    r = sb.execute_code("bash", check)
    assert r.output == "a\nd\n/\ns\n/\n2\nw.txt\n", r.output
    start = time.monotonic()
    sb.restore(snap)
    assert time.monotonic() - start < 1.0  # no container was started
    assert engine.api.inspect_container(sb.container_id)["State"]["StartedAt"] == started
    r = sb.execute_code("bash", check)
    assert r.output == "/\n/\n0\n", r.output
    r = sb.execute_code("bash", _COUNT_SLEEPS)
    assert r.output == "0\n"


def test_agent_processes_go_before_the_supervisor_when_memory_runs_out(sb: Any) -> None:
    # The supervisor shares the container's memory limit; its death would cost a restart.
    r = sb.execute_code("bash", "cat /proc/self/oom_score_adj /proc/1/oom_score_adj")
    assert r.output == "1000\n0\n"
    r = sb.execute_code("python", "print(open('/proc/self/oom_score_adj').read().strip())")
    assert r.output == "1000\n"
    # Many processes that together exceed the limit: agent processes die, not it.
    code = "for i in $(seq 6); do python3 -c 'x = bytearray(60 << 20); import time; "
    code += "time.sleep(3)' & done; wait; echo done"
    r = sb.execute_code("bash", code, timeout_s=20)
    assert r.exit_code == 0 and r.output.endswith("done\n") and not r.restarted, r
    assert "Killed" in r.output  # the limit was reached, and an agent process paid
    assert sb.execute_code("python", "print('fine')").output == "fine\n"


@pytest.mark.parametrize(
    "tamper",
    [
        "resource.prlimit(1, resource.RLIMIT_NOFILE, (12, 12))",
        "resource.prlimit(1, resource.RLIMIT_CPU, (1, 1))",
        "os.setpriority(os.PRIO_PROCESS, 1, 19)",
        "os.sched_setaffinity(1, {min(os.sched_getaffinity(1))})",
    ],
)
def test_a_supervisor_whose_limits_agent_code_changed_is_replaced(sb: Any, tamper: str) -> None:
    # Same uid suffices to change these of another process, and they would outlive
    # every reset; the supervisor notices at its next request and the host restarts.
    if "affinity" in tamper and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no affinity to narrow")
    before = sb.execute_code("bash", "cat /proc/1/limits; cat /proc/1/stat | cut -d' ' -f19")
    r = sb.execute_code("python", f"import os, resource\n{tamper}\nprint('done')")
    assert (r.exit_code, r.output) == (0, "done\n")
    assert sb.execute_code("bash", "echo fine").output == "fine\n"  # bash needs no request
    sb.restore(sb.capture())  # the next request: a fresh container answers it
    after = sb.execute_code("bash", "cat /proc/1/limits; cat /proc/1/stat | cut -d' ' -f19")
    assert after.output == before.output
    r = sb.execute_code(
        "python",
        f"import os\nprint(sorted(os.sched_getaffinity(0)) == {sorted(os.sched_getaffinity(0))!r})",
    )
    assert (r.exit_code, r.output, r.restarted) == (0, "True\n", False)
