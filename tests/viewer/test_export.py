import json

import pytest

from bat_gym.viewer import Site
from bat_gym.viewer.export import score_explanation


def test_inspect_log_has_a_sample_per_cell(eval_fail):
    site = Site([eval_fail])
    log = json.loads(site.get("r0.eval.json")[0])
    cells = sorted(p.stem for p in (eval_fail / "cells").glob("*.json"))
    assert log["version"] == 2 and log["eval"]["task"] == "bat_gym/toy_pipeline"
    assert sorted(s["id"] for s in log["samples"]) == cells
    sample = log["samples"][0]
    roles = [m["role"] for m in sample["messages"]]
    assert roles[:2] == ["system", "user"] and "tool" in roles
    calls = [
        c for m in sample["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])
    ]
    assert calls and all(isinstance(c["arguments"], dict) for c in calls)
    score = sample["scores"]["bat_gym"]
    assert 0 <= score["value"] <= 1 and score["metadata"]["verdict"]["stages"]


def test_inspect_reads_the_export(eval_fail, tmp_path):
    log_mod = pytest.importorskip("inspect_ai.log", reason="inspect-ai is not installed")
    path = tmp_path / "run.json"
    path.write_bytes(Site([eval_fail]).get("r0.eval.json")[0])
    log = log_mod.read_eval_log(str(path))
    assert log.status == "success" and len(log.samples) == 2
    tool_msgs = [m for m in log.samples[0].messages if m.role == "tool"]
    assert tool_msgs and tool_msgs[0].function == "execute_code"
    score = log.samples[0].scores["bat_gym"]
    assert score.value < 1  # the sloppy Validate stage cost reward
    # Inspect's viewer shows the explanation: the verdict's line and its failed items.
    assert score.explanation == score_explanation(score.metadata["verdict"])
    assert score.explanation.startswith("E2E reward") and " | FAIL S" in score.explanation


def test_a_grpo_steps_rollouts_export_too(tmp_path):
    from .test_site import grpo_run

    site = Site([grpo_run(tmp_path, steps=12)])
    log = json.loads(site.get("r0-step-11.eval.json")[0])
    assert len(log["samples"]) == 8 and log["samples"][0]["metadata"]["step"] == 11
    assert site.get("r0-step-12.eval.json") is None
    log_mod = pytest.importorskip("inspect_ai.log", reason="inspect-ai is not installed")
    path = tmp_path / "step.json"
    path.write_bytes(site.get("r0-step-11.eval.json")[0])
    assert len(log_mod.read_eval_log(str(path)).samples) == 8
