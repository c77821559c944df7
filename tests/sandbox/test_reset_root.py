"""A reset restores the whole workspace, root included, whatever the last episode did to it.

Evaluation, the audit and GRPO reuse an env for episode after episode, so an episode
that locks ``/workspace`` (``chmod 000``/``555``), swaps a folder a later stage needs
for a file or a link, leaves extended attributes or chattr flags, or kills its own
supervisor with the root locked must not cost the next episode anything: after a
reset, a tool call can write, and the scripted teacher earns what it earns on a fresh
env.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

from bat_gym.audits.exploits import make_exploit
from bat_gym.core.sandbox import SandboxLimits, make_sandbox
from bat_gym.core.sandbox.base import Isolation, Sandbox
from bat_gym.core.sandbox.local import detect_isolation
from bat_gym.core.sandbox.snapshot import BlobStore, WorkspaceIndex
from bat_gym.evaluation.harness import play_episode
from bat_gym.policies import ScriptedPolicy

LIMITS = SandboxLimits(timeout_s=10, memory_mb=512, max_processes=64, record_output_bytes=8192)
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602
_NOATIME, _NODUMP = 0x80, 0x40
MARK = "user.left_by_the_last_episode"


def flags_of(path: Path) -> int | None:
    """chattr flags of ``path``, or None where its file system has none."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return struct.unpack_from("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8)))[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def set_flags(path: Path, flags: int) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags).ljust(8, b"\0"))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def xattrs_of(path: Path) -> list[str]:
    return [n for n in os.listxattr(path, follow_symlinks=False) if not n.startswith("security.")]


def mark(path: Path) -> bool:
    """Leave a user xattr on ``path``; False where its file system takes none."""
    try:
        os.setxattr(path, MARK, b"1", follow_symlinks=False)
        return True
    except OSError:
        return False


# -- the restore itself, on a plain directory --------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    for d in ("pipeline", "outputs", "validation", "data"):
        (root / d).mkdir()
        (root / d / "keep.txt").write_text(d)
    return root


def test_a_restore_unlocks_marks_and_remakes_the_root_and_its_folders(ws: Path, tmp_path: Path):
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws)
    snap = index.capture(store)
    index.restore(snap, store)  # as a reset leaves it
    before = {p: flags_of(ws / p) for p in ("", "pipeline")}

    marked = all(mark(p) for p in (ws, ws / "outputs", ws / "data/keep.txt"))
    flagged = set_flags(ws, (flags_of(ws) or 0) | _NOATIME | _NODUMP)
    set_flags(ws / "pipeline", (flags_of(ws / "pipeline") or 0) | _NOATIME)
    (ws / "outputs").chmod(0o000)
    (ws / "validation").chmod(0o555)
    (ws / "validation/keep.txt").chmod(0o444)
    (ws / "pipeline/keep.txt").unlink()
    (ws / "pipeline").rmdir()
    (ws / "pipeline").write_text("locked")  # a folder a later stage needs, now a file
    (ws / "data/keep.txt").unlink()
    (ws / "data").rmdir()
    (ws / "data").symlink_to(".")  # ... and a link
    ws.chmod(0o000)
    index.scan()  # a step's scan records all of this

    index.restore(snap, store)

    assert stat.S_IMODE(ws.stat().st_mode) == 0o755
    assert WorkspaceIndex(ws).scan().digest == snap.digest
    for d in ("pipeline", "outputs", "validation", "data"):
        assert (ws / d).is_dir() and not (ws / d).is_symlink()
        assert stat.S_IMODE((ws / d).stat().st_mode) == 0o755
        assert (ws / d / "keep.txt").read_text() == d
    if marked:
        for p in (ws, ws / "outputs", ws / "data/keep.txt"):
            assert xattrs_of(p) == [], p
    if flagged:
        assert flags_of(ws) == before[""]
        assert flags_of(ws / "pipeline") == before["pipeline"]
    (ws / "outputs/new.txt").write_text("writable")


def test_a_file_marked_since_the_last_restore_is_rewritten_though_a_scan_saw_it(
    ws: Path, tmp_path: Path
):
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws, watch=True)
    snap = index.capture(store)
    index.restore(snap, store)
    if not mark(ws / "data/keep.txt"):
        pytest.skip("this file system takes no user xattrs")
    index.scan()  # same content and mode: only the ctime says it was touched

    index.restore(snap, store)

    assert xattrs_of(ws / "data/keep.txt") == []
    assert index.restore(snap, store) == 0  # and an untouched workspace costs nothing


def test_a_root_replaced_by_a_link_is_made_again(ws: Path, tmp_path: Path):
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws)
    snap = index.capture(store)
    ws.rename(tmp_path / "moved")
    ws.symlink_to(tmp_path / "moved")  # only unisolated: a sandbox's root is a mount point

    index.restore(snap, store)

    assert ws.is_dir() and not ws.is_symlink()
    assert stat.S_IMODE(ws.stat().st_mode) == 0o755
    assert WorkspaceIndex(ws).scan().digest == snap.digest


# -- a sandbox, sabotaged from inside ------------------------------------------------------


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest) -> str:
    """Both backends restore through the same index and follow the same rule."""
    if request.param == "docker":
        request.getfixturevalue("docker_client")
    else:
        best, why = detect_isolation()
        if best is not Isolation.BWRAP:
            pytest.skip(f"no bubblewrap isolation here: {why}")
    return request.param


@pytest.fixture
def box(backend: str) -> Iterator[Sandbox]:
    sb = make_sandbox(backend, limits=LIMITS)
    yield sb
    sb.close()


LAYOUT = "mkdir -p pipeline outputs validation && echo 'print(1)' > pipeline/infer.py"
SABOTAGE = """
python3 -c 'import os
for p in (".", "outputs", "pipeline/infer.py"): os.setxattr(p, "user.note", b"hi")'
chattr +A +d . outputs 2>/dev/null
chmod 000 outputs
chmod 555 validation
rm -rf pipeline && echo locked > pipeline
mv /workspace /elsewhere 2>/dev/null
chmod 000 /workspace
echo sabotaged
"""


def assert_writable(sb: Sandbox) -> None:
    r = sb.execute_code(
        "bash",
        "cd /workspace && echo ok > outputs/x && echo ok > validation/x && cat pipeline/infer.py "
        "&& python3 -c 'import os; print(sorted(os.listxattr(\".\")))'",
    )
    assert r.exit_code == 0 and r.output.split() == ["print(1)", "[]"], r.output


def test_a_reset_undoes_a_locked_replaced_and_marked_workspace(box: Sandbox):
    box.execute_code("bash", LAYOUT)
    snap = box.capture()
    box.restore(snap)
    flags = {d: flags_of(box.workspace / d) for d in ("", "outputs")}
    r = box.execute_code("bash", SABOTAGE)
    assert "sabotaged" in r.output, r.output

    box.restore(snap)

    assert box.scan().digest == snap.digest
    assert {d: flags_of(box.workspace / d) for d in ("", "outputs")} == flags
    assert xattrs_of(box.workspace) == xattrs_of(box.workspace / "outputs") == []
    assert_writable(box)


def test_a_reset_restarts_a_dead_supervisor_in_the_restored_workspace(box: Sandbox):
    box.execute_code("bash", LAYOUT)
    snap = box.capture()
    # Lowering the supervisor's priority makes it stop at the next request; the fresh
    # one starts in the workspace, which must be unlocked by then.
    r = box.execute_code(
        "bash",
        "chmod 000 /workspace; python3 -c 'import os; os.setpriority(os.PRIO_PROCESS, 1, 5)'",
    )
    assert r.exit_code == 0, r.output

    box.restore(snap)

    assert_writable(box)


# -- an env, played after the exploit ------------------------------------------------------


@pytest.fixture
def make_env(toy_bank, backend: str):
    envs = []

    def make():
        env = gym.make("bat/E2E-v0", benchmark="toy_pipeline", states=toy_bank, backend=backend)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


@pytest.mark.parametrize("focus", ["S2", "S4", "E2E"])
def test_the_teacher_after_a_sabotage_earns_what_it_earns_on_a_fresh_env(
    make_env, toy, toy_bank, focus: str
):
    state = toy_bank.get(toy_bank.select(focus=focus)[0])
    teacher = ScriptedPolicy("teacher")
    fresh, _ = play_episode(make_env(), teacher, state, toy)
    env = make_env()
    sabotage, _ = play_episode(env, make_exploit("workspace_root_sabotage"), state, toy)

    after, _ = play_episode(env, teacher, state, toy)

    assert fresh["verdict"].reward > 0
    assert after["verdict"].reward == fresh["verdict"].reward
    assert sabotage["verdict"].reward < fresh["verdict"].reward
    sb = env.unwrapped.sandbox
    assert sb.execute_code("bash", "echo ok > /workspace/probe && cat /workspace/probe").ok
