"""The structured step outcome: ``info["tool_errors"]`` and ``info["stop_reason"]``."""

import pytest

from bat_gym.core.spec import Budgets
from bat_gym.env import STOP_REASONS, Completion, StageEnv
from bat_gym.evaluation.episodes import episode_trace
from bat_gym.evaluation.harness import _failures

EXEC = '{"name": "execute_code", "arguments": {"language": "bash", "code": "true"}}'
FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


def calls(*bodies: str) -> str:
    return "".join(f"<tool_call>{b}</tool_call>" for b in bodies)


@pytest.fixture
def make_env(toy, toy_bank):
    envs = []

    def make(**budgets):
        env = StageEnv("S1", benchmark=toy, states=toy_bank, budgets=Budgets(**budgets))
        envs.append(env)
        env.reset(seed=0)
        return env

    yield make
    for env in envs:
        env.close()


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("I think we are done.", {"call": None, "tool": None, "kind": "malformed"}),
        ("<tool_call>{bad}</tool_call>", {"call": None, "tool": None, "kind": "malformed"}),
        (
            calls(EXEC, '{"name": "rm_rf", "arguments": {}}'),
            {"call": 1, "tool": "rm_rf", "kind": "unknown_tool"},
        ),
        (
            calls('{"name": "execute_code", "arguments": {"language": "bash"}}'),
            {"call": 0, "tool": "execute_code", "kind": "invalid_arguments"},
        ),
    ],
    ids=["no-call", "bad-json", "unknown-tool", "missing-argument"],
)
def test_a_refused_call_is_a_structured_error_and_the_text_stays(make_env, action, expected):
    env = make_env()
    obs, _, terminated, truncated, info = env.step(action)
    (error,) = info["tool_errors"]
    assert {k: error[k] for k in expected} == expected
    assert obs == f"[tool call error] {error['message']}"  # what the policy reads
    assert info["stop_reason"] is None and not terminated and not truncated
    assert info["refused_turns"] == 1 and info["tool_calls"] == 0
    _, *_, info = env.step(calls(EXEC))
    assert info["tool_errors"] == [] and info["refused_turns"] == 1 and info["tool_calls"] == 1


def test_finish_is_the_finished_stop(make_env):
    env = make_env()
    *_, info = env.step(calls(EXEC))
    assert info["stop_reason"] is None
    _, _, terminated, truncated, info = env.step(FINISH)
    assert terminated and not truncated and info["stop_reason"] == "finished"
    trace = episode_trace(info)  # what the viewer shows of an evaluated episode
    assert trace["stop_reason"] == "finished" and trace["refused_turns"] == 0


@pytest.mark.parametrize(
    ("budgets", "actions", "reason"),
    [
        ({"max_turns": 2}, ["nothing", "nothing"], "turn_budget"),
        ({"max_tool_calls": 1}, [calls(EXEC, EXEC)], "tool_call_budget"),
        ({"max_response_tokens": 50}, [Completion("no call here", num_tokens=60)], "token_budget"),
        (
            {"max_turns": 1, "max_response_tokens": 50},
            [Completion("no call here", num_tokens=60)],
            "token_budget",
        ),
    ],
    ids=["turns", "tool-calls", "tokens", "tokens-and-turns"],
)
def test_each_budget_names_its_stop(make_env, budgets, actions, reason):
    env = make_env(**budgets)
    for action in actions:
        _, _, terminated, truncated, info = env.step(action)
    assert truncated and not terminated and info["stop_reason"] == reason
    assert reason in STOP_REASONS
    env.reset(seed=0)
    assert env.stop_reason is None and env.refused_turns == 0


def test_a_refused_workspace_is_its_own_stop(make_env):
    env = make_env()
    quota = "mkdir m && cd m && seq 1 9000 | xargs touch"
    _, _, terminated, truncated, info = env.step(calls(EXEC.replace('"true"', f'"{quota}"'), EXEC))
    assert truncated and not terminated and info["stop_reason"] == "workspace_rejected"
    assert env.rejection is not None


class _Verdict:
    rejected = None
    gates = ()


@pytest.mark.parametrize(
    ("stop", "refused", "turns", "expected"),
    [
        ("finished", 0, 3, []),
        ("turn_budget", 0, 3, ["turn_budget"]),
        ("tool_call_budget", 1, 3, ["tool_call_budget"]),
        ("token_budget", 2, 3, ["token_budget", "malformed_calls"]),
        ("workspace_rejected", 0, 1, []),
    ],
)
def test_the_harness_classifies_by_the_fields(stop, refused, turns, expected):
    info = {"verdict": _Verdict(), "stop_reason": stop, "refused_turns": refused, "turns": turns}
    result = {"finished": stop == "finished", "task": None, "stages": {}}
    assert _failures(info, result) == expected
