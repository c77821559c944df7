"""Whole-sandbox caps: memory and process count across all of a sandbox's processes.

Each test that needs a cgroup forks a child that joins the agent leaf the way agent
processes do (writing ``0`` through a descriptor from ``join_fds``); the test process
itself never joins, so a cap that works kills or stops only the child.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bat_gym.core.errors import SandboxError, SandboxUnavailable
from bat_gym.core.sandbox import cgroups
from bat_gym.core.sandbox.cgroups import CapSupport, SandboxCgroup, detect_caps, join, require_caps

# Outside the range slots.py leases, so the child cannot eat into a live sandbox's
# RLIMIT_NPROC.
UNPRIVILEGED_UID = 61999
CHILD_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def caps() -> CapSupport:
    support, why = detect_caps()
    if support is CapSupport.NONE:
        pytest.skip(why)
    return support


@pytest.fixture
def group(caps: CapSupport) -> Iterator[SandboxCgroup]:
    g = SandboxCgroup(memory_mb=64, max_processes=8)
    yield g
    g.close()


@pytest.fixture
def agent_fds(group: SandboxCgroup) -> Iterator[list[int]]:
    """The agent leaf's descriptors; the supervisor's are closed at once."""
    supervisor, agent = group.join_fds()
    for fd in supervisor:
        os.close(fd)
    yield agent
    for fd in agent:
        os.close(fd)


def fork(fn: Callable[[], int | None]) -> int:
    """Run ``fn`` in a forked child (its return value is the exit status); return its pid."""
    pid = os.fork()
    if pid == 0:
        rc = 70
        try:
            rc = fn() or 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(rc)
    return pid


def wait(pid: int) -> int:
    """The child's wait status; kill it and fail if it outlives ``CHILD_TIMEOUT_S``."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"child {pid} did not finish in {CHILD_TIMEOUT_S} s")


def read_line(fd: int) -> str:
    assert select.select([fd], [], [], CHILD_TIMEOUT_S)[0], "the child did not answer"
    return os.read(fd, 4096).decode()


def agent_file(g: SandboxCgroup, name: str) -> Path:
    """The agent leaf's ``name`` in whichever hierarchy has it."""
    return next(p / "agent" / name for p in g.paths if (p / "agent" / name).exists())


# -- detection and opting out: run everywhere --------------------------------------------


def test_detection_reason_is_one_line() -> None:
    support, why = detect_caps()
    assert support in set(CapSupport)
    assert why.strip() and "\n" not in why
    assert detect_caps() == (support, why)  # cached


@pytest.fixture
def no_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BAT_GYM_ALLOW_UNCAPPED", raising=False)
    monkeypatch.setitem(cgroups._DETECTED, "result", (CapSupport.NONE, "no cgroup here", None))


def test_require_caps_names_the_fixes(no_caps: None) -> None:
    with pytest.raises(SandboxUnavailable) as info:
        require_caps()
    msg = str(info.value)
    for fix in (
        "no cgroup here",
        "root",
        "Delegate=yes",
        "BAT_GYM_ALLOW_UNCAPPED=1",
        "caps='none'",
    ):
        assert fix in msg
    with pytest.raises(SandboxUnavailable):
        SandboxCgroup(64, 8)


def test_opting_out_runs_uncapped(no_caps: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert require_caps(opt_out=True) is CapSupport.NONE
    monkeypatch.setenv("BAT_GYM_ALLOW_UNCAPPED", "1")
    assert require_caps() is CapSupport.NONE


def test_require_caps_returns_what_detection_found() -> None:
    support, _ = detect_caps()
    if support is not CapSupport.NONE:
        assert require_caps() is support


def test_parses_proc_cgroup_and_mountinfo(tmp_path: Path) -> None:
    own = cgroups._parse_proc_cgroup(
        "5:pids:/a\n4:memory,cpu:/b/c\n1:name=systemd:/\n0::/user.slice/x.scope\n"
    )
    assert own == {
        "pids": "/a",
        "memory": "/b/c",
        "cpu": "/b/c",
        "name=systemd": "/",
        "": "/user.slice/x.scope",
    }
    point = tmp_path / "cg root"
    (point / "x.scope").mkdir(parents=True)
    escaped = str(point).replace(" ", "\\040")
    mounts = cgroups._parse_mountinfo(
        f"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 /user.slice {escaped} rw,nosuid shared:9 - cgroup2 cgroup2 rw\n"
        "22 1 0:21 / /proc rw - proc proc rw\n"
    )
    assert mounts == [
        ("cgroup", "/", "/sys/fs/cgroup/memory", ["rw", "memory"]),
        ("cgroup2", "/user.slice", str(point), ["rw"]),
    ]
    assert cgroups._resolve(own[""], mounts[1:]) == point / "x.scope"
    assert cgroups._resolve("/elsewhere", mounts[1:]) is None


class FakeCgroup2:
    """Just enough of cgroup v2's kernel side, in a plain directory, to run the v2 code.

    mkdir makes a group's interface files (with the controllers its parent hands
    down), rmdir removes a group holding no process and no child group, a write to
    ``cgroup.procs`` moves a pid, and a group holding processes refuses (``EBUSY``)
    to hand controllers to its children: the "no internal processes" rule.
    """

    def __init__(self, top: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.top = top
        top.mkdir()
        self.populate(top, ["cpu", "memory", "pids"])
        (top / "cgroup.procs").write_text(f"{os.getpid()}\n")
        real_mkdir, real_rmdir, real_write = Path.mkdir, Path.rmdir, cgroups._write

        def mkdir(path: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False):
            new = not path.exists()
            real_mkdir(path, mode, parents, exist_ok)
            if new and self.owns(path):
                self.populate(path, (path.parent / "cgroup.subtree_control").read_text().split())

        def rmdir(path: Path) -> None:
            if not self.owns(path):
                return real_rmdir(path)
            if not path.exists():
                raise FileNotFoundError(errno.ENOENT, "no such group", str(path))
            if self.procs(path) or any(p.is_dir() for p in path.iterdir()):
                raise OSError(errno.EBUSY, "busy", str(path))
            shutil.rmtree(path)

        def write(path: Path, value: object) -> None:
            if not self.owns(path):
                return real_write(path, value)
            if not path.exists():
                raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
            if path.name == "cgroup.procs":
                pid = str(value) if str(value) != "0" else str(os.getpid())
                for procs in self.top.rglob("cgroup.procs"):
                    procs.write_text(
                        "".join(f"{p}\n" for p in self.procs(procs.parent) if p != pid)
                    )
                path.write_text(path.read_text() + f"{pid}\n")
            elif path.name == "cgroup.subtree_control":
                have = set(path.read_text().split())
                # What the parent hands down now (the kernel's cgroup.controllers).
                above = (
                    "cgroup.controllers" if path.parent == self.top else "../cgroup.subtree_control"
                )
                offered = (path.parent / above).read_text().split()
                for token in str(value).split():
                    if token[1:] not in offered:
                        raise OSError(errno.ENOENT, "no such controller", token)
                    have.add(token[1:])
                if self.procs(path.parent):
                    raise OSError(errno.EBUSY, "the group holds processes", str(path))
                path.write_text(" ".join(sorted(have)))
            else:
                path.write_text(str(value))

        monkeypatch.setattr(Path, "mkdir", mkdir)
        monkeypatch.setattr(Path, "rmdir", rmdir)
        monkeypatch.setattr(cgroups, "_write", write)

    def owns(self, path: Path) -> bool:
        return path == self.top or self.top in path.parents

    @staticmethod
    def procs(group: Path) -> list[str]:
        return (group / "cgroup.procs").read_text().split()

    @staticmethod
    def populate(group: Path, controllers: list[str]) -> None:
        files = {
            "cgroup.controllers": " ".join(controllers),
            "cgroup.subtree_control": "",
            "cgroup.procs": "",
        }
        if "memory" in controllers:
            files |= {"memory.max": "max", "memory.swap.max": "max", "memory.peak": "0"}
            files["memory.events"] = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"
        if "pids" in controllers:
            files |= {"pids.max": "max", "pids.current": "0"}
        for name, text in files.items():
            (group / name).write_text(text)


def test_v2_on_a_fake_delegated_subtree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCgroup2(tmp_path / "scope", monkeypatch)
    mounts = [("cgroup2", "/", str(tmp_path), ["rw"])]
    support, why, layout = cgroups._probe_from({"": "/scope"}, mounts)
    root = fake.top / "bat_gym"
    assert (support, why) == (
        CapSupport.V2,
        f"cgroup v2 at {root} (moved 1 process(es) of {fake.top} into {root / 'host'})",
    )
    assert (fake.procs(fake.top), fake.procs(root / "host")) == ([], [str(os.getpid())])
    for group in (fake.top, root):
        assert (group / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert not any(p.name.startswith("sb-") for p in root.iterdir())  # the probe's group
    # A child of this process starts in bat_gym/host and finds the same tree.
    assert cgroups._probe_from({"": "/scope/bat_gym/host"}, mounts)[:2] == (
        CapSupport.V2,
        f"cgroup v2 at {root}",
    )
    monkeypatch.setitem(cgroups._DETECTED, "result", (support, why, layout))
    with SandboxCgroup(64, 8) as g:
        (path,) = g.paths
        agent = path / "agent"
        assert path.parent == root and (path / "supervisor").is_dir()
        assert (path / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
        limits = {
            name: (agent / name).read_text()
            for name in ("memory.max", "memory.swap.max", "pids.max")
        }
        assert limits == {"memory.max": str(64 << 20), "memory.swap.max": "0", "pids.max": "8"}
        supervisor, agent_fds = g.join_fds()
        assert (len(supervisor), len(agent_fds)) == (1, 1)
        for fd in supervisor + agent_fds:
            os.close(fd)
        (agent / "pids.current").write_text("3\n")
        (agent / "memory.peak").write_text("12345\n")
        (agent / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
        assert (g.agent_pids(), g.memory_peak_bytes(), g.oom_kills()) == (3, 12345, 2)
    assert not path.exists()
    assert root.is_dir()  # bat_gym/host still holds this process


# -- caps: need a cgroup ------------------------------------------------------------------


def test_agent_over_memory_cap_is_oom_killed(group: SandboxCgroup, agent_fds: list[int]) -> None:
    def hog() -> int:
        join(agent_fds)
        buf = bytearray(200 << 20)
        for i in range(0, len(buf), 4096):  # every page, in case none was touched yet
            buf[i] = 1
        return 0

    status = wait(fork(hog))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert group.oom_kills() == 1
    peak = group.memory_peak_bytes()
    assert peak is None or 0 < peak <= 64 << 20
    here = bytearray(128 << 20)  # the test process is not capped
    assert len(here) == 128 << 20


def test_a_joined_process_and_the_threads_it_starts_are_all_in_the_agent_leaf(
    group: SandboxCgroup, agent_fds: list[int]
) -> None:
    # Under v1 an agent descriptor moves only the calling thread (the cheap move):
    # a process that joins single-threaded, as every joiner does, moves whole, and
    # what it starts afterwards is born in the leaf.
    v2 = group.support is CapSupport.V2  # under v1, the "0::" line is another hierarchy

    def joiner() -> int:
        join(agent_fds)
        t = threading.Thread(target=time.sleep, args=(0.5,))
        t.start()
        tasks = os.listdir("/proc/self/task")
        where = set()
        for tid in tasks:
            for line in Path(f"/proc/self/task/{tid}/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if (controllers == "") == v2 and (
                    v2 or {"memory", "pids"} & set(controllers.split(","))
                ):
                    where.add(path.rsplit("/", 1)[-1])
        t.join()
        return 0 if len(tasks) == 2 and where == {"agent"} else 1

    assert wait(fork(joiner)) == 0
    assert group.agent_pids() == 0  # it is gone, and it was counted where it belongs


def test_swap_cannot_lift_the_memory_cap(group: SandboxCgroup) -> None:
    if group.support is CapSupport.V1:
        if not agent_file_exists(group, "memory.memsw.limit_in_bytes"):
            pytest.skip("this kernel does not account swap (swapaccount=0)")
        assert int(agent_file(group, "memory.memsw.limit_in_bytes").read_text()) == 64 << 20
    elif agent_file_exists(group, "memory.swap.max"):
        assert agent_file(group, "memory.swap.max").read_text().strip() == "0"


def agent_file_exists(g: SandboxCgroup, name: str) -> bool:
    return any((p / "agent" / name).exists() for p in g.paths)


def test_agent_cannot_fork_past_max_processes(group: SandboxCgroup, agent_fds: list[int]) -> None:
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()

    def forker() -> int:
        join(agent_fds)
        os.close(go_w)  # so that the test's copy is the only one left
        kids = []
        try:
            while len(kids) < 50:
                pid = os.fork()
                if pid == 0:
                    try:
                        os.read(go_r, 1)  # returns once the test lets go
                    finally:
                        os._exit(0)
                kids.append(pid)
        except BlockingIOError:  # EAGAIN: the pids cap
            pass
        os.write(report_w, str(len(kids)).encode())
        os.read(go_r, 1)
        for pid in kids:
            os.waitpid(pid, 0)
        return 0

    assert group.agent_pids() == 0
    pid = fork(forker)
    os.close(go_r)
    assert int(read_line(report_r)) == group.max_processes - 1  # the forker is one
    assert group.agent_pids() == group.max_processes
    os.close(go_w)  # every reader sees EOF
    assert wait(pid) == 0
    assert group.agent_pids() == 0
    os.close(report_r)
    os.close(report_w)


def test_close_removes_the_directories(caps: CapSupport) -> None:
    g = SandboxCgroup(64, 8)
    assert all((p / leaf).is_dir() for p in g.paths for leaf in ("supervisor", "agent"))
    g.close()
    assert not any(p.exists() for p in g.paths)
    g.close()  # idempotent
    with pytest.raises(SandboxError):
        g.agent_pids()
    with pytest.raises(SandboxError):
        g.join_fds()


def test_close_leaves_a_busy_group_and_does_not_raise(
    group: SandboxCgroup, agent_fds: list[int]
) -> None:
    go_r, go_w = os.pipe()

    def sleeper() -> int:
        join(agent_fds)
        os.close(go_w)
        os.read(go_r, 1)
        return 0

    pid = fork(sleeper)
    os.close(go_r)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while group.agent_pids() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    group.close()  # the child is still in the agent leaf
    assert all(p.exists() for p in group.paths)
    os.close(go_w)
    assert wait(pid) == 0
    for p in group.paths:  # the sweep would, once this process is gone
        assert cgroups._remove_group(p)


def test_group_of_a_dead_owner_is_swept(caps: CapSupport) -> None:
    r, w = os.pipe()

    def leaker() -> None:
        g = SandboxCgroup(64, 8)
        os.write(w, "\n".join(map(str, g.paths)).encode())
        os._exit(0)  # while g is alive: no close(), no finalizer

    with SandboxCgroup(64, 8) as live:
        assert wait(fork(leaker)) == 0
        leaked = [Path(p) for p in read_line(r).split("\n")]
        assert all(p.is_dir() for p in leaked)
        assert all(p.is_dir() for p in live.paths)  # the child's sweep left ours
        with SandboxCgroup(64, 8):
            assert not any(p.exists() for p in leaked)
            assert all(p.is_dir() for p in live.paths)
    os.close(r)
    os.close(w)


def test_two_groups_at_once_do_not_clash(caps: CapSupport) -> None:
    with SandboxCgroup(64, 8) as a, SandboxCgroup(128, 16) as b:
        assert a.name != b.name
        assert not set(a.paths) & set(b.paths)
        assert agent_file(a, "pids.max").read_text().strip() == "8"
        assert agent_file(b, "pids.max").read_text().strip() == "16"
        supervisor, agent = a.join_fds()
        go_r, go_w = os.pipe()

        def member() -> int:
            join(agent)
            os.close(go_w)
            os.read(go_r, 1)
            return 0

        pid = fork(member)
        os.close(go_r)
        for fd in supervisor + agent:
            os.close(fd)
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while a.agent_pids() == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert (a.agent_pids(), b.agent_pids()) == (1, 0)
        os.close(go_w)
        assert wait(pid) == 0


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to another uid needs root")
def test_join_works_after_dropping_to_an_unprivileged_uid(
    group: SandboxCgroup, agent_fds: list[int]
) -> None:
    procs = [p / "agent" / "cgroup.procs" for p in group.paths]

    def dropped() -> int:
        os.setgroups([])
        os.setgid(UNPRIVILEGED_UID)
        os.setuid(UNPRIVILEGED_UID)
        try:
            os.open(procs[0], os.O_WRONLY)
        except PermissionError:
            pass
        else:
            return 2  # this uid could open the file itself: the test proves nothing
        join(agent_fds)
        with open("/proc/self/cgroup") as f:
            mine = f.read()
        # One line per hierarchy, each ending in this group's agent leaf.
        wanted = f"/{group.name}/agent\n"
        return 0 if mine.count(wanted) == len(group.paths) else 3

    assert os.waitstatus_to_exitcode(wait(fork(dropped))) == 0
