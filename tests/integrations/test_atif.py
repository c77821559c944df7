"""`bat-gym export atif`: evaluation traces, GRPO rollout logs and bank demonstrations as ATIF.

The runs are real: `bat-gym eval` of the teacher on toy_pipeline, a GRPO step's log
written by the trainer's own `log_rollouts` from episodes played through the one
episode loop, and the session's toy bank. Every exported file is checked for ATIF's
structure here, and validated by Harbor's own pydantic model where Harbor is installed
(.venv-harbor, `.ci/venv-harbor.sh`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.env import StageEnv
from bat_gym.integrations.atif import ATIF_VERSION
from bat_gym.integrations.atif_export import AtifExportError, export_atif
from bat_gym.policies import ScriptedPolicy
from bat_gym.rollout import policy_actor, run_episode
from bat_gym.rollout.token_episode import EpisodeResult
from bat_gym.rubrics.verifier.reward import RubricReward
from bat_gym.trainers.rollout_log import log_rollouts

RUNNER = CliRunner()


def _export(run_dir: Path, out: Path) -> list[dict]:
    result = RUNNER.invoke(app, ["export", "atif", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(out.rglob("*.json"))
    assert f"{len(files)} ATIF trajectories" in result.output
    return [json.loads(p.read_text()) for p in files]


def _check_structure(doc: dict) -> None:
    """ATIF's rules, read from its spec: what Harbor's model enforces, without Harbor."""
    assert doc["schema_version"] == ATIF_VERSION
    assert doc["agent"]["name"] and doc["agent"]["version"]
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    for step in doc["steps"]:
        assert step["source"] in ("system", "user", "agent")
        assert isinstance(step["message"], str)
        if step["source"] != "agent":
            assert "tool_calls" not in step
        ids = {c["tool_call_id"] for c in step.get("tool_calls", [])}
        for call in step.get("tool_calls", []):
            assert isinstance(call["arguments"], dict) and call["function_name"]
        for result in (step.get("observation") or {}).get("results", []):
            assert result.get("source_call_id", next(iter(ids), None)) in ids | {None}
    assert doc["final_metrics"]["total_steps"] == len(doc["steps"])


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "teacher"
    args = ["eval", "--policy", "teacher", "--benchmark", "toy_pipeline", "--repeats", "1"]
    result = RUNNER.invoke(app, [*args, "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _played(toy, toy_bank, state_id: str, policy: str) -> EpisodeResult:
    """One episode of ``policy`` through the one episode loop, as a GRPO rollout holds it."""
    env = RubricReward(StageEnv(benchmark=toy, states=toy_bank))
    actor = policy_actor(ScriptedPolicy(policy, protocol="hermes"), toy, toy_bank.get(state_id))
    try:
        end = run_episode(env, actor, state_id=state_id)
        info = end.info
        return EpisodeResult(
            state_id=state_id,
            prompt_ids=[],
            response_ids=[],
            response_mask=[1] * 3,
            response_logprobs=None,
            reward=float(end.reward),
            verdict=info["verdict"],
            num_turns=int(info["turns"]),
            num_replies=0,
            stop_reason="terminated" if end.terminated else "truncated",
            messages=list(info["messages"]),
            info=info,
        )
    finally:
        env.close()


@pytest.fixture(scope="module")
def grpo_dir(toy, toy_bank, tmp_path_factory) -> tuple[Path, list[EpisodeResult]]:
    out = tmp_path_factory.mktemp("grpo")
    state = sorted(toy_bank.select(focus="S4"))[0]
    rollouts = [_played(toy, toy_bank, state, p) for p in ("teacher", "naive")]
    log_rollouts(out, 1, rollouts, ["target", "target"])
    return out, rollouts


def test_an_evaluation_exports_steps_calls_observations_and_the_verdict(eval_dir, tmp_path):
    docs = _export(eval_dir, tmp_path / "atif")
    assert len(docs) == 2  # one per held-out cell
    for doc in docs:
        _check_structure(doc)
        trace = json.loads(Path(doc["extra"]["source"]["path"]).read_text())
        agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
        assert len(agent_steps) == trace["turns"]
        calls = [c for s in agent_steps for c in s.get("tool_calls", [])]
        assert [c["function_name"] for c in calls][-1] == "finish"
        # Every run call's output is the observation answering it, by id.
        answered = {
            r["source_call_id"]: r["content"]
            for s in agent_steps
            for r in (s.get("observation") or {}).get("results", [])
        }
        tool_msgs = {
            m["tool_call_id"]: m["content"] for m in trace["messages"] if m["role"] == "tool"
        }
        assert answered == tool_msgs
        executions = [e for s in agent_steps for e in s.get("extra", {}).get("executions", [])]
        assert [e["exit_code"] for e in executions] == [
            c["exit_code"] for c in trace["record"]["calls"]
        ]
        last = doc["steps"][-1]
        reward = trace["reward"]
        assert last["source"] == "system" and last["message"].startswith(f"E2E reward {reward:.3f}")
        assert doc["extra"]["reward"] == reward and reward > 0
        assert doc["agent"]["name"] == "bat_gym teacher"
        credits = {s["stage"]: s["credit"] for s in trace["verdict"]["stages"]}
        assert doc["final_metrics"]["extra"]["stage_credit"] == credits


def test_a_grpo_log_exports_each_kept_rollout_with_its_failed_items(grpo_dir, tmp_path):
    run, rollouts = grpo_dir
    docs = _export(run, tmp_path / "atif")
    assert len(docs) == 2
    by_reward = sorted(docs, key=lambda d: d["extra"]["reward"])
    for doc in docs:
        _check_structure(doc)
        assert doc["extra"]["source"]["kind"] == "grpo_rollout"
        assert doc["extra"]["source"]["step"] == 1
    rewards = sorted(r.reward for r in rollouts)
    assert [d["extra"]["reward"] for d in by_reward] == rewards
    naive = by_reward[0]
    assert rewards[0] < rewards[1]
    failed = [i for i in naive["extra"]["verdict"]["items"] if i["status"] == "failed"]
    assert failed, "the naive rollout fails items; they are in the verdict brief"
    # The verdict step names each failed item with its detail, the "why" of the score.
    for item in failed:
        assert (
            f"FAIL {item['stage']}.{item['item']} ({item['check']})"
            in naive["steps"][-1]["message"]
        )
    # The start state's replayed turns are context, not the rollout's own.
    copied = [s for s in naive["steps"] if s.get("is_copied_context")]
    assert copied and all(s["source"] == "agent" for s in copied)


def test_bank_demonstrations_export_with_their_reward(toy_bank, tmp_path):
    docs = _export(toy_bank.root, tmp_path / "atif")
    assert len(docs) == len(toy_bank)
    for doc in docs:
        _check_structure(doc)
        row = toy_bank.get(doc["extra"]["state_id"])
        assert doc["extra"]["reward"] == row.provenance["demonstration"]["reward"]
        own = [s for s in doc["steps"] if s["source"] == "agent" and not s.get("is_copied_context")]
        assert own and own[-1]["tool_calls"][-1]["function_name"] == "finish"


def test_a_folder_without_episodes_says_what_it_wants(tmp_path):
    with pytest.raises(AtifExportError, match="holds no stored episode"):
        export_atif(tmp_path, tmp_path / "out")
    result = RUNNER.invoke(app, ["export", "atif", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert result.exit_code != 0


def test_harbor_validates_every_export(eval_dir, grpo_dir, toy_bank, tmp_path):
    """Harbor's own ATIF model accepts every file (runs in .venv-harbor)."""
    trajectories = pytest.importorskip(
        "harbor.models.trajectories",
        reason="Harbor is not installed here (it needs Python 3.12+): .ci/venv-harbor.sh runs this",
    )
    for n, run in enumerate((eval_dir, grpo_dir[0], toy_bank.root)):
        for path in export_atif(run, tmp_path / str(n)):
            parsed = trajectories.Trajectory.model_validate_json(path.read_text())
            assert parsed.schema_version == ATIF_VERSION
            assert (
                parsed.steps[-1].extra["reward"] == json.loads(path.read_text())["extra"]["reward"]
            )
