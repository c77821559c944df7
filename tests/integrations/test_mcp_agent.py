"""An external MCP agent as a policy: `--policy mcp-agent:COMMAND` in an evaluation.

The agent is a real process on the mcp package's own client (mcp_replay_agent.py). It
replays the teacher's calls of each held-out cell, so its cells must score exactly as
the in-process teacher's do; one that exits early is scored as it stands, one that
fails is an invalid cell, never a zero.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from bat_gym.core.errors import ConfigError  # noqa: E402
from bat_gym.evaluation import EvalConfig, evaluate  # noqa: E402
from bat_gym.policies import make_policy  # noqa: E402

AGENT = Path(__file__).with_name("mcp_replay_agent.py")
CFG = EvalConfig(repeats=1, workers=2, progress=False, max_attempts=1)


@pytest.fixture(scope="module")
def teacher_run(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    return out, evaluate(toy, make_policy("teacher"), out, CFG)


@pytest.fixture(scope="module")
def calls_file(teacher_run, tmp_path_factory) -> Path:
    """prompt sha256 -> the teacher's calls in that cell, from its episode traces."""
    out, _ = teacher_run
    table = {}
    for trace_path in sorted((out / "episodes").glob("*.json")):
        trace = json.loads(trace_path.read_text())
        messages, prefix = trace["messages"], trace["prefix_messages"]
        prompt = "\n\n".join(m["content"] for m in messages[:prefix] if m["role"] != "assistant")
        calls = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for m in messages[prefix:]
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()
        ]
        assert calls, trace_path
        table[hashlib.sha256(prompt.encode()).hexdigest()] = calls
    path = tmp_path_factory.mktemp("agent") / "calls.json"
    path.write_text(json.dumps(table))
    return path


def _agent(calls_file: Path, *extra: str) -> str:
    return f"mcp-agent:{sys.executable} {AGENT} {calls_file} {' '.join(extra)}"


def test_an_mcp_agent_replaying_the_teacher_scores_as_the_teacher(
    toy, teacher_run, calls_file, tmp_path
):
    _, teacher = teacher_run
    policy = make_policy(_agent(calls_file))
    with policy:
        report = evaluate(toy, policy, tmp_path, CFG)
    assert report.aggregates.valid
    for mine, theirs in zip(report.cells, teacher.cells, strict=True):
        assert mine.cell == theirs.cell
        assert (mine.overall, mine.task, mine.reward, mine.stages) == (
            theirs.overall,
            theirs.task,
            theirs.reward,
            theirs.stages,
        )
        assert mine.finished
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["policy"]["kind"] == "McpAgentPolicy"
    assert manifest["policy"]["command"][1] == str(AGENT)
    assert str(AGENT) in manifest["policy"]["sha256"]
    assert manifest["policy"]["clients"] == [{"name": "replay-agent", "version": "0.1"}]


def test_an_agent_that_leaves_early_is_scored_as_it_stands(toy, calls_file, tmp_path):
    policy = make_policy(_agent(calls_file, "--exit-after", "1"))
    with policy:
        report = evaluate(toy, policy, tmp_path, CFG)
    assert report.aggregates.valid  # scored, not infrastructure
    for cell in report.cells:
        assert not cell.finished and cell.reward < 0.5
        assert "turn_budget" in cell.failures


def test_an_agent_that_fails_makes_an_invalid_cell_not_a_zero(toy, calls_file, tmp_path):
    policy = make_policy(_agent(calls_file, "--exit-after", "1", "--exit-status", "3"))
    with policy:
        report = evaluate(toy, policy, tmp_path, CFG)
    assert not report.aggregates.valid
    for cell in report.cells:
        assert not cell.valid and cell.overall is None
        assert "the agent exited with status 3" in cell.error


def test_a_missing_agent_command_is_a_clear_error():
    with pytest.raises(ConfigError, match="not an executable file or on PATH"):
        make_policy("mcp-agent:no-such-agent-program --flag")
    with pytest.raises(ConfigError, match="names no command"):
        make_policy("mcp-agent:")
