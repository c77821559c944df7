"""Starting, resetting, crashing and stopping ``local`` sandboxes: nothing is left behind."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bat_gym.core.errors import SandboxUnavailable
from bat_gym.core.sandbox import SandboxLimits, make_sandbox
from bat_gym.core.sandbox.base import Isolation, Sandbox
from bat_gym.core.sandbox.local import detect_isolation
from bat_gym.core.sandbox.slots import sweep_stale

LIMITS = SandboxLimits(timeout_s=20)
# Background jobs left by a call are killed when it returns where the sandbox is capped;
# tests of what close and reset kill keep them alive past their call by running uncapped.
UNCAPPED = {"caps": "none"}


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private runtime dir, so sweeps and slot checks see only this test's sandboxes."""
    rt = tmp_path / "rt"
    monkeypatch.setenv("BAT_GYM_RUNTIME_DIR", str(rt))
    return rt


@pytest.fixture
def isolated(runtime: Path) -> None:
    best, why = detect_isolation()
    if best is not Isolation.BWRAP:
        pytest.skip(f"no bubblewrap isolation here: {why}")


def processes() -> Iterator[tuple[int, int, str, bytes, str, str]]:
    """(pid, uid, state, cmdline, cwd, pid namespace) of every process on the host."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        base = f"/proc/{name}"
        try:
            with open(f"{base}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0].decode()
            with open(f"{base}/cmdline", "rb") as f:
                cmdline = f.read()
            uid = os.stat(base).st_uid
            ns = os.readlink(f"{base}/ns/pid")
        except OSError:
            continue
        try:
            cwd = os.readlink(f"{base}/cwd")
        except OSError:  # a zombie has none
            cwd = ""
        yield int(name), uid, state, cmdline, cwd, ns


def leftovers(pid_ns: str, slot: Path, uid: int | None = None) -> list[tuple[int, str, bytes]]:
    """Processes of a sandbox: in its PID namespace, naming its slot dir, or of its uid."""
    return [
        (pid, state, cmdline[:80])
        for pid, puid, state, cmdline, cwd, ns in processes()
        if ns == pid_ns or str(slot).encode() in cmdline or cwd.startswith(str(slot)) or puid == uid
    ]


def inner_pid(pid: int) -> int:
    """The pid a host process has in its own (innermost) PID namespace."""
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("NSpid:"))
    return int(line.split()[-1])


def identify(sb: Sandbox) -> tuple[str, int]:
    """The sandbox's PID namespace and the uid its code runs as, read from inside."""
    r = sb.execute_code("bash", "readlink /proc/self/ns/pid; id -u")
    pid_ns, uid = r.output.split()
    return pid_ns, int(uid)


BACKGROUND = """
sleep 1000 &
(sleep 1001 &)
setsid sleep 1002 &
nohup sleep 1003 >/dev/null 2>&1 &
python -c "import os, time
if os.fork() == 0:
    os.setsid(); time.sleep(1000)" &
"""


@pytest.mark.usefixtures("isolated")
def test_close_kills_every_process_and_removes_the_slot(runtime: Path) -> None:
    sb = make_sandbox("local", limits=LIMITS, **UNCAPPED)
    slot = sb.workspace.parent
    pid_ns, uid = identify(sb)
    assert sb.execute_code("bash", BACKGROUND).exit_code == 0
    sb.execute_code(
        "python",
        "import os\nif os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '1004'])",
    )
    deadline = time.monotonic() + 2
    while len(leftovers(pid_ns, slot)) < 9 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(leftovers(pid_ns, slot)) >= 9  # bwrap, supervisor, server, subshell, 6 jobs

    sb.close()

    assert leftovers(pid_ns, slot, uid) == []
    assert not slot.exists()
    sb.close()  # a second close is harmless


@pytest.mark.usefixtures("isolated")
def test_killed_owner_leaves_no_process_and_its_slot_is_swept(runtime: Path) -> None:
    alive = make_sandbox("local", limits=LIMITS)  # takes the first slot before the owner
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from bat_gym.core.sandbox import make_sandbox\n"
            "sb = make_sandbox('local')\n"
            f"r = sb.execute_code('bash', {BACKGROUND!r} + 'readlink /proc/self/ns/pid')\n"
            "print(r.output.split()[-1], sb.workspace.parent, flush=True)\n"
            "time.sleep(1000)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid_ns, slot_name = owner.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    slot = Path(slot_name)

    def running() -> list[tuple[int, str, bytes]]:
        # The sandbox's init may stay a zombie until the host's init reaps it: it runs
        # nothing and holds nothing but its pid.
        return [p for p in leftovers(pid_ns, slot) if p[1] != "Z"]

    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running() == []

    with alive:
        assert slot.exists() and slot != alive.workspace.parent
        assert sweep_stale() == 1
        assert not slot.exists()
        assert alive.workspace.exists()  # a live sandbox's slot is never swept
        assert alive.execute_code("bash", "echo ok").output == "ok\n"
        assert sweep_stale() == 0


@pytest.mark.usefixtures("isolated")
def test_crashed_supervisor_is_reported_and_replaced(runtime: Path) -> None:
    with make_sandbox("local", limits=LIMITS) as sb:
        pid_ns, _ = identify(sb)
        assert sb.execute_code("bash", "echo kept > /workspace/kept.txt").exit_code == 0
        init = next(pid for pid, *_, ns in processes() if ns == pid_ns and inner_pid(pid) == 1)
        pidfd = os.pidfd_open(init)
        os.kill(init, signal.SIGKILL)  # from the host: the one signal PID 1 cannot refuse
        select.select([pidfd], [], [], 5)  # readable once init, and so the sandbox, is gone
        os.close(pidfd)

        r = sb.execute_code("bash", "echo never")
        assert (r.exit_code, r.restarted) == (None, True)
        assert "restarted" in r.output
        r = sb.execute_code("bash", "cat kept.txt; readlink /proc/self/ns/pid")
        assert r.exit_code == 0 and not r.restarted
        kept, new_ns = r.output.split()
        assert kept == "kept"
        # A new sandbox: a new init. (The kernel may give the new pid namespace the freed
        # one's inode number, so the namespace id alone does not tell them apart.)
        new_init = next(pid for pid, *_, ns in processes() if ns == new_ns and inner_pid(pid) == 1)
        assert new_init != init
        assert sb.execute_code("python", "print(1 + 1)").output == "2\n"


SCRATCH = """
import ctypes, os, subprocess
os.makedirs('/tmp/locked/inner')
open('/tmp/locked/inner/state', 'w').write('x')
os.chmod('/tmp/locked/inner', 0)
os.chmod('/tmp/locked', 0o500)
open('/tmp/plain', 'w').write('x')
open('/dev/shm/segment', 'w').write('x')
open('/workspace/added.txt', 'w').write('x')
libc = ctypes.CDLL(None, use_errno=True)
print('shm', libc.shmget(0, 4096, 0o1600))      # IPC_PRIVATE, IPC_CREAT | 0600
print('msg', libc.msgget(0, 0o1600))
print('sem', libc.semget(0, 1, 0o1600))
rt = ctypes.CDLL('librt.so.1', use_errno=True)
print('mq', rt.mq_open(b'/q', os.O_CREAT | os.O_RDWR, 0o600, None))  # refused: RLIMIT_MSGQUEUE
subprocess.Popen(['sleep', '1000'], start_new_session=True)
"""

LOOK = """
ls -A /tmp /dev/shm
tail -n +2 /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem | grep -v '^==>' | grep -c .
for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done | grep -c '^sleep'
"""


@pytest.mark.usefixtures("isolated")
def test_reset_leaves_nothing_of_the_episode(runtime: Path) -> None:
    with make_sandbox("local", limits=LIMITS, **UNCAPPED) as sb:
        before = sb.execute_code("bash", LOOK).output
        snap = sb.capture()
        r = sb.execute_code("python", SCRATCH)
        assert r.exit_code == 0, r.output
        ids = dict(line.split() for line in r.output.splitlines())
        assert min(int(ids[k]) for k in ("shm", "msg", "sem")) >= 0 and ids["mq"] == "-1"
        assert sb.execute_code("bash", LOOK).output != before

        sb.restore(snap)

        assert sb.execute_code("bash", LOOK).output == before
        # The Python environment is bound at its own path; a venv under /tmp shows there.
        bound = {
            Path(p).relative_to("/tmp").parts[0]
            for p in {sys.prefix, sys.base_prefix}
            if p.startswith("/tmp/")
        }
        shown = before.split()
        assert shown[:2] == ["/dev/shm:", "/tmp:"] and shown[-2:] == ["0", "0"]
        assert set(shown[2:-2]) == {"home"} | bound
        assert sb.digest() == snap.digest
        assert not (sb.workspace / "added.txt").exists()


def test_calls_behave_like_fresh_processes(runtime: Path) -> None:
    best, _ = detect_isolation()
    isolation = "bwrap" if best is Isolation.BWRAP else "none"
    with make_sandbox("local", limits=LIMITS, isolation=isolation) as sb:
        # Pipes close the way they do in a terminal: no "Broken pipe" from `yes`.
        r = sb.execute_code("bash", "yes | head -c 4; echo; trap -p")
        assert (r.exit_code, r.output) == (0, "y\ny\n\n")
        code = (
            "import multiprocessing as mp, signal\n"
            "print(signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,"
            " signal.getsignal(signal.SIGINT).__name__)\n"
            "with mp.get_context('fork').Pool(2) as pool:\n"
            "    print(pool.map(abs, [-1, -2]))\n"
        )
        r = sb.execute_code("python", code)
        assert r.output == "True default_int_handler\n[1, 2]\n", r.output


def test_unisolated_sandbox_works_and_close_stops_its_jobs(runtime: Path) -> None:
    marker = f"bat-gym-test-{uuid.uuid4().hex}"
    with make_sandbox("local", limits=LIMITS, isolation="none", **UNCAPPED) as sb:
        assert sb.isolation is Isolation.NONE
        assert sb.execute_code("bash", "echo hi > a.txt; cat a.txt").output == "hi\n"
        assert sb.execute_code("python", "print(open('a.txt').read())").output == "hi\n\n"
        snap = sb.capture()
        sb.execute_code("bash", f"rm a.txt; (exec -a {marker} sleep 1000) &")
        deadline = time.monotonic() + 2
        while not any(marker.encode() in p[3] for p in processes()) and time.monotonic() < deadline:
            time.sleep(0.01)
        sb.restore(snap)
        assert sb.digest() == snap.digest
        assert not any(marker.encode() in p[3] for p in processes())
        sb.execute_code("bash", f"(exec -a {marker} sleep 1000) &")
        time.sleep(0.1)
    assert not any(marker.encode() in p[3] for p in processes())


def test_unknown_isolation_is_a_value_error(runtime: Path) -> None:
    with pytest.raises(ValueError, match="isolation must be"):
        make_sandbox("local", isolation="chroot")
    assert not runtime.exists() or list(runtime.glob("slot-*")) == []


def test_unisolated_fallback_needs_an_explicit_opt_in(
    runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bat_gym.core.sandbox import local

    monkeypatch.setattr(local, "detect_isolation", lambda: (Isolation.NONE, "no bwrap binary"))
    monkeypatch.delenv("BAT_GYM_ALLOW_UNISOLATED", raising=False)
    with pytest.raises(SandboxUnavailable, match="no bwrap binary"):
        make_sandbox("local")
    monkeypatch.setenv("BAT_GYM_ALLOW_UNISOLATED", "1")
    with pytest.raises(SandboxUnavailable):
        make_sandbox("local", isolation="bwrap")  # an explicit demand is never downgraded
    with make_sandbox("local", limits=LIMITS) as sb:
        assert sb.isolation is Isolation.NONE
        assert sb.execute_code("bash", "echo ok").output == "ok\n"
    assert list(runtime.glob("slot-*/")) == []


@pytest.mark.usefixtures("isolated")
def test_freeze_stops_background_writers_before_capturing(runtime: Path) -> None:
    with make_sandbox("local", limits=LIMITS) as sb:
        start = "(while :; do date +%s%N > busy.txt; done) >/dev/null 2>&1 & until [ -s busy.txt ]; do :; done"
        assert sb.execute_code("bash", start).exit_code == 0
        frozen = sb.freeze()
        time.sleep(0.2)
        # The writer is gone: the workspace still equals what was frozen.
        assert sb.digest() == frozen.digest
        assert any(e.path == "busy.txt" for e in frozen.entries)
        assert sb.execute_code("bash", "echo ok").output == "ok\n"


def test_preload_waits_for_the_first_python_call_and_never_imports_agent_files(isolated):
    """numpy is imported by the supervisor at the first python call, not at start.

    By then agent code has had the workspace: a ``numpy.py`` it left there must not be
    what the supervisor (PID 1 of the sandbox, which answers for every call) imports.
    """
    with make_sandbox("local", limits=LIMITS) as sb:
        planted = (
            "cat > numpy.py <<'EOF'\n"
            "open('/workspace/pwned', 'w').write('imported by ' + str(__import__('os').getpid()))\n"
            "EOF"
        )
        assert sb.execute_code("bash", planted).exit_code == 0
        r = sb.execute_code("python", "import sys; print(sys.modules['numpy'].__file__)")
        assert r.exit_code == 0, r.output
        assert "site-packages" in r.output or "dist-packages" in r.output, r.output
        assert not (sb.workspace / "pwned").exists()
        # Warm from then on: the next call finds numpy already imported.
        warm = sb.execute_code("python", "import sys; print('numpy' in sys.modules)")
        assert warm.output.strip() == "True"
