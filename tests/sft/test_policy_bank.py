"""SFT rows from a bank taught by a Policy: its recorded actions, not the script."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from bat_gym.bank import build_bank, load_trajectory
from bat_gym.core.spec import E2E
from bat_gym.policies import Policy, PolicyOutput, PolicyRequest, ScriptedPolicy
from bat_gym.sft import sft_rows


class Stumbles(Policy):
    """The scripted teacher, after one opening message that holds no tool call."""

    name = "stumbles"

    def __init__(self) -> None:
        self.teacher = ScriptedPolicy("teacher")

    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        out = []
        for r in requests:
            assert r.context is not None
            if r.context.turn == 0:
                out.append(PolicyOutput("Let me look around first."))
            else:
                context = dataclasses.replace(r.context, turn=r.context.turn - 1)
                out += self.teacher.act_batch([dataclasses.replace(r, context=context)])
        return out


@pytest.fixture(scope="module")
def default_rows(toy, toy_bank):
    """The default-teacher bank's rows of the first training seed (a policy bank's tasks)."""
    first = {s.state_id for s in toy_bank if s.focus == E2E and s.provenance["seed"] == 0}
    return [r for r in sft_rows(toy_bank, toy) if r.source_state_id in first]


def test_the_scripted_teacher_as_a_policy_gives_the_default_rows(
    toy, default_rows, tmp_path, monkeypatch
):
    bank = build_bank(toy, tmp_path / "b", teacher=ScriptedPolicy("teacher"))
    assert all(load_trajectory(bank.store, s) is not None for s in bank)

    def no_script(*args, **kwargs):
        raise AssertionError("a policy-taught bank replays its recorded actions")

    # Rows come from the stored trajectories: the benchmark's script is never asked.
    monkeypatch.setattr(toy, "teacher_turns", no_script)
    rows = sft_rows(bank, toy)
    assert rows and rows == default_rows


def test_a_refused_recorded_turn_is_replayed_but_not_a_target(toy, default_rows, tmp_path):
    bank = build_bank(toy, tmp_path / "b", tracks=["threshold"], teacher=Stumbles())
    assert bank.manifest["labels"] == {"success": 1}
    rows = sft_rows(bank, toy)
    want = [r for r in default_rows if r.track == "threshold"]
    # Every turn after the stumble is a row, one turn later than the script's.
    assert [r.turn for r in rows] == [r.turn + 1 for r in want]
    assert [(r.stage, r.target) for r in rows] == [(r.stage, r.target) for r in want]
    # Each context is the script's, with the stumble and its error after the prompt
    # (tool call ids count on from the same place: the refused turn ran no call).
    for got, ref in zip(rows, want, strict=True):
        stumble, error = got.context[2:4]
        assert stumble == {"role": "assistant", "content": "Let me look around first."}
        assert error["role"] == "user" and error["content"].startswith("[tool call error]")
        assert got.context[:2] + got.context[4:] == ref.context
