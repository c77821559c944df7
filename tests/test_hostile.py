"""Hostile agents: nothing a message or agent code does breaks its env, another env or the host.

Each test plays what a policy under RL will eventually try, through the public env
API, and asserts that the episode ends cleanly (an observation, or a verdict with a
named failure category), and that the env, a second env and a fresh process all work
afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

from bat_gym.core.errors import UnsafeSnapshot
from bat_gym.core.sandbox import make_sandbox
from bat_gym.core.sandbox.slots import runtime_dir

FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


def call(code: str, language: str = "bash") -> str:
    args = {"language": language, "code": code}
    return f"<tool_call>{json.dumps({'name': 'execute_code', 'arguments': args})}</tool_call>"


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    """Every hostile case runs on both backends: they follow the same rule."""
    if request.param == "docker":
        request.getfixturevalue("docker_client")
    return request.param


@pytest.fixture
def make(toy_bank, backend):
    envs = []

    def make_env(stage: str = "E2E", **kwargs):
        env = gym.make(
            f"bat/{stage}-v0",
            benchmark="toy_pipeline",
            states=toy_bank,
            backend=backend,
            **kwargs,
        )
        envs.append(env)
        return env

    yield make_env
    for env in envs:
        env.close()


def play(env, actions: list[str]):
    """Step every action until the episode ends; return (obs, reward, info) of the last step."""
    env.reset(seed=0)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return obs, reward, info
    raise AssertionError("the episode did not end")


def assert_still_works(env, make) -> None:
    """The same env, a second env and a fresh process all reset and run a call."""
    for e in (env, make()):
        e.reset(seed=1)
        obs, *_ = e.step(call("echo fine"))
        assert "fine" in obs, obs
    code = "from bat_gym.core.sandbox import make_sandbox\nwith make_sandbox() as sb: print(sb.execute_code('bash', 'echo ok').output, end='')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout == "ok\n", out.stderr[-2000:]


# -- links and names the host must not follow or cannot store --------------------------


@pytest.mark.parametrize(
    "code",
    [
        "ln -s /etc/passwd leak",  # absolute
        "mkdir -p d && ln -s ../../.. d/up",  # climbs out
        "mkdir -p a/b && ln -s ../.. a/b/l && ln -s a/b/l/.. e",  # a chain that climbs out
        "touch $'bad\\xff\\xfename'",  # not UTF-8
        "ln -s $'\\xff' odd-target",  # link target not UTF-8
    ],
    ids=["absolute-link", "escaping-link", "link-chain", "non-utf8-name", "non-utf8-target"],
)
def test_unsafe_workspaces_end_as_zero_verdicts(make, code):
    env = make()
    obs, reward, info = play(env, [call(code), FINISH])
    verdict = info["verdict"]
    assert reward == 0.0 and verdict.reward == 0.0
    assert verdict.rejected == "unsafe_workspace", verdict.notes
    assert all(s.credit == 0.0 for s in verdict.stages)
    assert_still_works(env, make)


def test_a_newline_in_a_name_is_stored_and_loaded_again(make, toy_bank):
    env = make()
    _, _, info = play(env, [call("echo x > $'two\\nlines' && echo y > plain"), FINISH])
    assert info["verdict"].rejected is None
    sandbox = env.unwrapped.sandbox
    snap = sandbox.frozen_store.get_snapshot(sandbox.index.scan().digest)
    assert "two\nlines" in [e.path for e in snap.entries]
    (sandbox.workspace / "two\nlines").unlink()
    sandbox.index.restore(snap, sandbox.frozen_store)  # loads back exactly
    assert (sandbox.workspace / "two\nlines").read_text() == "x\n"
    assert_still_works(env, make)


# -- shapes: depth, width, size ----------------------------------------------------------


DEEP = "python3 -c \"import os\nos.chdir('/workspace')\nfor _ in range({n}):\n    os.mkdir('d'); os.chdir('d')\""


def test_a_tree_thousands_deep_ends_the_episode_and_is_removed(make):
    env = make()
    obs, reward, info = play(env, [call(DEEP.format(n=1100)), call("echo never"), FINISH])
    assert reward == 0.0 and info["verdict"].rejected == "unsafe_workspace"
    assert "episode ends here" in obs
    assert_still_works(env, make)  # reset removed the tree: step, reset and close work
    assert not (env.unwrapped.sandbox.workspace / "d").exists()


@pytest.mark.parametrize(
    "code",
    [
        "mkdir m && cd m && seq 1 9000 | xargs touch",  # too many files
        "truncate -s 300M a.bin && truncate -s 300M b.bin",  # nothing on disk, 600 MB apparent
    ],
    ids=["file-count", "sparse-files"],
)
def test_a_workspace_past_its_quota_ends_the_episode(make, code):
    env = make()
    obs, reward, info = play(env, [call(code), call("echo never"), FINISH])
    assert reward == 0.0 and info["verdict"].rejected == "quota_exceeded"
    assert "quota_exceeded" in obs
    assert_still_works(env, make)


def test_a_frozen_workspace_does_not_grow_the_bank_store(make, toy_bank):
    before = sum(1 for _ in (toy_bank.store.root / "blobs").rglob("*"))
    env = make()
    for i in range(3):
        play(env, [call(f"head -c 100000 /dev/urandom > junk{i}.bin"), FINISH])
    assert sum(1 for _ in (toy_bank.store.root / "blobs").rglob("*")) == before
    scratch = env.unwrapped.sandbox.frozen_store.root / "blobs"
    assert len([p for p in scratch.rglob("*") if p.is_file()]) == 1  # the last episode's only


def test_setuid_bits_never_reach_a_snapshot(make):
    env = make()
    _, _, info = play(
        env, [call("cp /bin/true t && chmod 6755 t && mkdir s && chmod 1777 s"), FINISH]
    )
    snap = env.unwrapped.sandbox.index.scan()
    modes = {e.path: e.mode for e in snap.entries}
    assert modes["t"] == 0o755 and modes["s"] == 0o777


# -- messages that Python cannot hold -----------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        '<tool_call>{"name": "execute_code", "arguments": {"language": "bash", "code": "echo \\ud800"}}</tool_call>',
        '<tool_call>{"name": "execute_code", "arguments": {"language": "python", "code": "print(\'\\udcff\')"}}</tool_call>',
        "<tool_call>" + "[" * 200_000 + "]" * 200_000 + "</tool_call>",
        '<tool_call>{"name": "execute_code", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>",
        '<tool_call>{"name": "execute_code", "arguments": {"code": '
        + "[" * 500
        + "]" * 500
        + "}}</tool_call>",
        "raw lone surrogate \ud800 in the message",
        "\x00" * 1000,
    ],
    ids=[
        "surrogate-bash",
        "surrogate-python",
        "deep-json",
        "huge-int",
        "deep-args",
        "raw-surrogate",
        "nul",
    ],
)
def test_messages_python_cannot_hold_are_observations(make, action):
    env = make()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and reward == 0.0
    json.dumps(info["messages"])  # everything recorded stays serializable
    assert_still_works(env, make)


def test_a_receipt_nested_past_the_recursion_limit_is_a_verdict(make):
    deep = "[" * 100_000 + "]" * 100_000
    code = f"mkdir -p validation && python3 -c \"print('{deep[:10]}' * 10000 + '{deep[-10:]}' * 10000)\" > validation/s3_validation.json"
    env = make()
    _, reward, info = play(env, [call(code), FINISH])
    assert info["verdict"].reward == reward == 0.0


# -- processes: races, leftovers, caps ----------------------------------------------------


def test_a_link_and_directory_swap_racing_the_freeze_ends_cleanly(make):
    swap = "mkdir -p x; (while :; do mv x y 2>/dev/null; ln -sfn /etc x; rm -f x; mv y x 2>/dev/null; done) >/dev/null 2>&1 &"
    env = make()
    for _ in range(5):
        _, reward, info = play(env, [call(swap), FINISH])
        assert info["verdict"].reward is not None
    assert_still_works(env, make)


def test_processes_do_not_outlive_their_call(make):
    env = make()
    env.reset(seed=0)
    obs, *_ = env.step(call("(while :; do :; done) & echo started"))
    assert "stopped" in obs
    sandbox = env.unwrapped.sandbox
    if getattr(sandbox, "_cgroup", None) is not None:  # nothing burns CPU between calls
        assert sandbox._cgroup.agent_pids() <= 1  # at most the idle bash server


def test_memory_of_all_processes_together_is_capped():
    from bat_gym.core.sandbox import SandboxLimits

    with make_sandbox("local", limits=SandboxLimits(total_memory_mb=256)) as sb:
        if sb.caps.value == "none":
            pytest.skip("no cgroup to cap with here")
        grab = "import time; b = bytearray(150 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(2)"
        res = sb.execute_code(
            "bash", f'for i in 1 2 3; do python3 -c "{grab}" & done; wait; echo done'
        )
        assert "Killed" in res.output and res.output.rstrip().endswith("done")
        assert sb.execute_code("bash", "echo alive").output == "alive\n"


def test_a_fork_bomb_is_contained(make):
    env = make()
    env.reset(seed=0)
    obs, *_ = env.step(call("b() { b | b & }; b; sleep 1; echo survived"))
    assert_still_works(env, make)


# -- the host side: slots, store, watches -------------------------------------------------


def test_a_deep_tree_left_in_a_dead_slot_does_not_poison_the_next_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("BAT_GYM_RUNTIME_DIR", str(tmp_path / "rt"))
    slot = runtime_dir() / "slot-0"
    os.makedirs(slot)
    fd = os.open(slot, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    script = textwrap.dedent(
        """
        from bat_gym.core.sandbox import make_sandbox
        with make_sandbox() as sb:
            print(sb.execute_code("bash", "echo ok").output, end="")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.stdout == "ok\n", out.stderr[-2000:]
    assert not (slot / "d").exists()


def test_a_corrupted_blob_never_reaches_a_workspace(toy, tmp_path):
    from bat_gym.bank import build_bank

    bank = build_bank(toy, tmp_path / "bank", tasks_per_track=1)
    state = bank.get(bank.select(focus="E2E")[0])
    snap = bank.store.get_snapshot(state.snapshot)
    entry = next(e for e in snap.entries if e.path == "task.json")
    blob = bank.store.blob_path(entry.digest)
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    blob.write_bytes(bytes(data))
    env = gym.make("bat/E2E-v0", benchmark="toy_pipeline", states=bank)
    try:
        with pytest.raises(UnsafeSnapshot, match="corrupted"):
            env.reset(options={"state_id": state.state_id})
    finally:
        env.close()


def test_inotify_watches_stay_bounded(tmp_path):
    from bat_gym.core.sandbox import WorkspaceIndex

    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(300):
        (ws / f"d{i}").mkdir()
    index = WorkspaceIndex(ws, watch=True, max_watches=100)
    first = index.scan()
    assert index._watch.watches == 0 and index._watch.overflowed
    (ws / "d0" / "new").write_text("seen")
    assert index.scan().digest != first.digest  # still correct: it walks instead
    index.close()


@pytest.mark.docker
def test_docker_sandbox_survives_the_same_trees():
    pytest.importorskip("docker")
    from bat_gym.core.errors import SandboxUnavailable

    try:
        sb = make_sandbox("docker")
    except SandboxUnavailable as exc:
        pytest.skip(f"no docker here: {exc}")
    with sb:
        sb.execute_code("bash", DEEP.format(n=1100))
        sb.execute_code("bash", "ln -s /etc/passwd leak; touch $'\\xff'")
        from bat_gym.core.errors import WorkspaceRejected

        with pytest.raises(WorkspaceRejected):
            sb.freeze()
        sb.restore(sb.store.get_snapshot(_empty(sb)))
        assert sb.execute_code("bash", "ls | wc -l").output.strip() == "0"


def _empty(sb) -> str:
    from bat_gym.core.sandbox import Snapshot

    snap = Snapshot.of([])
    sb.store.put_snapshot(snap)
    return snap.digest
