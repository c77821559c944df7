"""verifiers v1: ``vf-eval bat-gym-stages`` against ``bat-gym serve-policy``, scored as in-process.

The end-to-end tests run the two commands a user runs: ``bat-gym serve-policy`` (the
scripted teacher or naive baseline behind an OpenAI-compatible endpoint) and
``vf-eval bat-gym-stages`` (verifiers' own runner: its interception server, agent,
harness and scoring). Each trace's reward and verdict metrics must equal those of the
same policy playing the same state in the in-process env (RubricReward around StageEnv).

verifiers 0.4 cannot share a venv with the dev extra: these tests run in their own venv
(``bash .ci/venv-verifiers.sh``) and skip elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "verifiers.v1",
    reason="verifiers 0.4 is not installed: it has a venv of its own (bash .ci/venv-verifiers.sh)",
)

import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.utils.loaders import (  # noqa: E402
    default_harness_id,
    environment_class,
    taskset_class,
    taskset_config_type,
)

from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.integrations.verifiers import (  # noqa: E402
    StageEpisodes,
    StageHarness,
    StageTaskset,
    _assistant_json,
    episode_scores,
)
from bat_gym.rubrics.verifier.reward import RubricReward  # noqa: E402

from .servers import free_port  # noqa: E402

BIN = Path(sys.executable).parent
ENV = "bat-gym-stages"
TOL = 1e-9


def _taskset(**config) -> StageTaskset:
    return taskset_class(ENV)(taskset_config_type(ENV)(id=ENV, **config))


def test_the_environment_module_exports_one_taskset_harness_and_env():
    # What vf-eval and prime-rl resolve from the id alone.
    assert taskset_class(ENV) is StageTaskset
    assert environment_class(ENV) is StageEpisodes
    assert default_harness_id(ENV) == ENV
    assert vf.load_harness(vf.HarnessConfig(id=ENV)).__class__ is StageHarness


def test_bank_states_become_serializable_tasks(toy_bank):
    tasks = list(_taskset(bank=str(toy_bank.root), focus="S3"))
    assert [t.data.state_id for t in tasks] == toy_bank.select(focus="S3")
    for t in tasks:
        wire = json.loads(t.data.model_dump_json())
        assert wire["bank"] == str(Path(toy_bank.root).resolve())
        assert wire["benchmark"] == "toy_pipeline" and wire["id"] == t.data.state_id
    assert [t.key for t in tasks] == [t.data.state_id for t in tasks]


def test_held_out_tasks_name_their_track_and_seed(toy):
    tasks = list(_taskset(repeats=1))
    assert sorted(t.data.track for t in tasks) == sorted(t.name for t in toy.spec.tracks)
    assert {t.data.seed for t in tasks} == {toy.evaluated_seeds()[0]}
    assert all(t.data.state_id.endswith(".E2E.success") and t.data.bank is None for t in tasks)


class _Message:
    """An OpenAI SDK assistant message's shape: content and tool_calls."""

    def __init__(self, content, calls):
        self.content = content
        self.tool_calls = [
            type("Call", (), {"id": f"c{i}", "function": type("F", (), fn)})()
            for i, fn in enumerate(calls)
        ]


def test_a_malformed_tool_call_is_the_envs_to_refuse(toy, toy_bank):
    env = RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank, protocol="openai"))
    try:
        env.reset(options={"state_id": toy_bank.select(focus="E2E")[0]})
        bad = _Message("", [{"name": "execute_code", "arguments": "{not json"}])
        _, _, terminated, truncated, info = env.step(_assistant_json(bad))
        assert not (terminated or truncated)
        assert info["tool_errors"][0]["kind"] == "malformed"
        good = _Message(
            "ok", [{"name": "execute_code", "arguments": '{"language": "bash", "code": "ls"}'}]
        )
        _, _, _, _, info = env.step(_assistant_json(good))
        assert info["tool_errors"] == [] and info["tool_calls"] == 1
    finally:
        env.close()


class _Server:
    """``bat-gym serve-policy`` as a user starts it, until closed."""

    def __init__(self, policy: str, *states: str) -> None:
        args = [str(BIN / "bat-gym"), "serve-policy", "--policy", policy, *states]
        args += ["--port", str(free_port())]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.url: str | None = None
        found = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line)
                match = re.search(r"(http://127\.0\.0\.1:\d+/v1)\b", line)
                if match and self.url is None:
                    self.url = match.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 180
        while not found.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail("bat-gym serve-policy did not start:\n" + "".join(self.lines[-20:]))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _vf_eval(url: str, out: Path, *options: str) -> list[dict]:
    """``vf-eval bat-gym-stages`` against ``url``; its traces (one per episode)."""
    args = [str(BIN / "vf-eval"), ENV, "--model", "scripted", "--client.base-url", url]
    args += ["--client.api-key-var", "BAT_GYM_TEST_KEY", "--no-push", "-c", "2"]
    args += ["-o", str(out), *options]
    env = {**os.environ, "BAT_GYM_TEST_KEY": "unused"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (traces,) = out.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces.read_text().splitlines()]
    return [trace for episode in episodes for trace in episode["traces"]]


def _native(bench, policy: str, track: str, seed: int, tmp: Path) -> dict:
    """The policy's episode of the held-out task in the in-process env: its scores."""
    from bat_gym.bank import task_states
    from bat_gym.core.sandbox.snapshot import BlobStore

    source = task_states(bench, [(track, seed)], "heldout", BlobStore(tmp))
    (state_id,) = source.select()
    return _native_play(bench, policy, source, state_id)


def _native_play(bench, policy: str, states, state_id: str) -> dict:
    """The policy's episode from ``state_id`` in the in-process env: its scores."""
    from bat_gym.evaluation.harness import play_episode
    from bat_gym.policies import make_policy

    env = RubricReward(StageEnv("E2E", benchmark=bench, states=states))
    agent = make_policy(policy)
    try:
        info, _ = play_episode(env, agent, states.get(state_id), bench)
        return episode_scores(info, info["turns"])
    finally:
        env.close()
        agent.close()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["teacher", "naive"])
def test_vf_eval_scores_held_out_states_as_the_native_env(policy, toy, tmp_path):
    server = _Server(policy, "--benchmark", "toy_pipeline")
    try:
        traces = _vf_eval(server.url, tmp_path / "vf", "--env.taskset.repeats", "1")
    finally:
        server.close()
    assert len(traces) == len(toy.spec.tracks)
    for i, trace in enumerate(traces):
        assert trace["ok"], trace["errors"]
        data = trace["task"]["data"]
        native = _native(toy, policy, data["track"], data["seed"], tmp_path / f"native{i}")
        assert native["state_id"] == data["state_id"]
        assert abs(trace["rewards"]["rubric_reward"]["score"] - native["reward"]) <= TOL
        expected = {k: v for k, v in native["scores"].items() if v is not None}
        assert trace["metrics"].keys() == expected.keys()
        for key, value in expected.items():
            assert abs(trace["metrics"][key] - value) <= TOL, (key, trace["metrics"], expected)
        # The same episode, not only the same scores: turns and tool calls as native.
        played = trace["info"]["bat_gym"]
        assert (played["turns"], played["tool_calls"]) == (native["turns"], native["tool_calls"])
    rewards = [t["rewards"]["rubric_reward"]["score"] for t in traces]
    # The two policies are told apart: the teacher wins every state, the naive baseline none.
    assert all(r == 1.0 for r in rewards) if policy == "teacher" else all(r < 1.0 for r in rewards)


@pytest.mark.slow
def test_vf_eval_plays_a_bank_state_from_its_stage_as_the_native_env(toy, toy_bank, tmp_path):
    # A mid-episode state (S3): its history is replayed to the model, the env resumes there.
    state_id = toy_bank.select(focus="S3")[0]
    server = _Server("teacher", "--bank", str(toy_bank.root))
    try:
        options = ["--env.taskset.bank", str(toy_bank.root), "--env.taskset.focus", "S3"]
        (trace,) = _vf_eval(server.url, tmp_path / "vf", *options, "--select.include.ids", state_id)
    finally:
        server.close()
    assert trace["ok"], trace["errors"]
    native = _native_play(toy, "teacher", toy_bank, state_id)
    assert trace["info"]["bat_gym"]["state_id"] == state_id
    assert abs(trace["rewards"]["rubric_reward"]["score"] - native["reward"]) <= TOL
    expected = {k: v for k, v in native["scores"].items() if v is not None}
    assert trace["metrics"] == pytest.approx(expected, abs=TOL)


def test_the_prime_rl_entries_in_the_docs_are_verifiers_env_configs():
    import tomllib

    from bat_gym.integrations.verifiers import StageTasksetConfig

    page = (Path(__file__).parents[2] / "docs" / "verifiers.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", page, re.S) if "[orchestrator" in b]
    orchestrator = tomllib.loads(block)["orchestrator"]
    entries = orchestrator["train"]["env"] + orchestrator["eval"]["env"]
    assert len(entries) == 2
    for entry in entries:
        # `name` is prime-rl's own key; the rest is the verifiers env config.
        config = vf.resolve_env_config({k: v for k, v in entry.items() if k != "name"})
        assert isinstance(config.taskset, StageTasksetConfig)
        assert environment_class(config.taskset.id) is StageEpisodes
    assert entries[0]["taskset"]["bank"] == "banks/toy"
