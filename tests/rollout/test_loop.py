"""The one episode loop: acting, stepping, the restart check, how an episode ends."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bat_gym.core.errors import BatGymError
from bat_gym.rollout import SandboxRestarted, Step, run_episode, sandbox_restarted, step


class ScriptedEnv:
    """Answers each message from a script of ``(terminated, truncated, restarted)``."""

    def __init__(self, script: list[tuple[bool, bool, bool]]) -> None:
        self.script = script
        self.resets: list[Any] = []
        self.actions: list[str] = []

    def reset(self, options: Any = None) -> tuple[str, dict[str, Any]]:
        self.resets.append(options)
        return "prompt", {"messages": [], "tools": [], "turns": 0, "record": None}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        terminated, truncated, restarted = self.script[len(self.actions)]
        self.actions.append(action)
        record = SimpleNamespace(calls=[SimpleNamespace(restarted=restarted)])
        info = {"turns": len(self.actions), "record": record}
        return f"obs{len(self.actions)}", 1.0 if terminated else 0.0, terminated, truncated, info


def test_an_episode_runs_until_the_policy_finishes_and_reports_every_step():
    env = ScriptedEnv([(False, False, False), (False, False, False), (True, False, False)])
    seen: list[Step] = []
    end = run_episode(env, lambda info: f"say {info['turns']}", state_id="s1", on_step=seen.append)
    assert env.resets == [{"state_id": "s1"}]
    assert env.actions == ["say 0", "say 1", "say 2"]
    assert [s.turn for s in seen] == [1, 2, 3] and seen[-1].done and not seen[0].done
    assert (end.turns, end.terminated, end.truncated, end.finished) == (3, True, False, True)
    assert end.reward == 1.0 and end.info["turns"] == 3


def test_a_budget_ends_the_episode_unfinished():
    env = ScriptedEnv([(False, False, False), (False, True, False)])
    end = run_episode(env, lambda info: "x")
    assert env.resets == [None]
    assert (end.turns, end.terminated, end.truncated, end.finished) == (2, False, True, False)


def test_an_actor_with_nothing_more_to_say_stops_the_episode_where_it_is():
    env = ScriptedEnv([(False, False, False)] * 3)
    turns = iter(["a"])
    end = run_episode(env, lambda info: next(turns, None))
    assert env.actions == ["a"]
    assert (end.turns, end.terminated, end.truncated) == (1, False, False)
    assert run_episode(ScriptedEnv([]), lambda info: None).reward is None


def test_a_given_reset_info_is_not_reset_again():
    env = ScriptedEnv([(True, False, False)])
    end = run_episode(env, lambda info: "x", info={"turns": 0, "messages": []})
    assert env.resets == [] and end.finished


def test_a_sandbox_restart_is_infrastructure_not_the_policys_failure():
    env = ScriptedEnv([(False, False, False), (False, False, True), (True, False, False)])
    seen: list[Step] = []
    with pytest.raises(SandboxRestarted) as caught:
        run_episode(env, lambda info: "x", on_step=seen.append)
    assert isinstance(caught.value, BatGymError) and caught.value.turn == 2
    assert "play it again" in str(caught.value)
    assert len(seen) == 1  # the crashed step is not handed on as the policy's

    env = ScriptedEnv([(False, False, False), (False, False, True), (True, False, False)])
    seen = []
    end = run_episode(env, lambda info: "x", on_step=seen.append, on_restart="ignore")
    assert end.finished and [s.restarted for s in seen] == [False, True, False]


def test_an_unknown_restart_policy_is_refused():
    with pytest.raises(ValueError, match="on_restart"):
        run_episode(ScriptedEnv([]), lambda info: None, on_restart="retry")


def test_one_step_and_the_restart_check():
    env = ScriptedEnv([(False, False, True)])
    env.reset()
    answer = step(env, "x", turn=4)
    assert (answer.turn, answer.observation, answer.reward, answer.restarted) == (
        4,
        "obs1",
        0.0,
        True,
    )
    assert not sandbox_restarted({"record": None}) and not sandbox_restarted({})


def test_a_hostile_message_is_an_observation_not_an_exception(toy, toy_bank):
    from bat_gym.env import StageEnv

    env = StageEnv("E2E", benchmark=toy, states=toy_bank)
    hostile = iter(["<tool_call>{not json", "\udcff" * 10, "<tool_call>" * 1000, ""])
    try:
        end = run_episode(
            env, lambda info: next(hostile, None), state_id=toy_bank.select(focus="E2E")[0]
        )
    finally:
        env.close()
    assert end.turns == 4 and not end.finished
    assert end.info["messages"][-1]["content"].startswith("[tool call error]")
