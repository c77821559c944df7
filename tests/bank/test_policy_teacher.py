"""Teaching with any Policy: stage boundaries from artifacts, verifier labels, replays."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from bat_gym.bank import StageBank, build_bank, load_trajectory
from bat_gym.cli import app
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.policies import Policy, PolicyOutput, PolicyRequest, ScriptedPolicy

HERMES = get_protocol("hermes")


def bash(code: str) -> ToolCall:
    return ToolCall(name="execute_code", arguments={"language": "bash", "code": code})


FINISH = ToolCall(name="finish", arguments={"summary": "done"})


class Commands(Policy):
    """A free policy: its n-th turn runs the n-th command, then it finishes.

    It never reads the episode context, like a learned policy, so its turns carry no
    stage labels.
    """

    name = "commands"

    def __init__(self, commands: Sequence[str]) -> None:
        self.commands = list(commands)

    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        out = []
        for r in requests:
            n = sum(m["role"] == "assistant" for m in r.messages)
            call = bash(self.commands[n]) if n < len(self.commands) else FINISH
            out.append(PolicyOutput(HERMES.render("", [call])))
        return out


def test_the_scripted_teacher_as_a_policy_gives_the_default_states(toy, toy_bank, tmp_path):
    bank = build_bank(toy, tmp_path / "b", teacher=ScriptedPolicy("teacher"))
    # Boundaries read from the artifacts fall where the script's own labels put them:
    # the same rows, the same workspaces.
    first = [s for s in toy_bank if s.provenance["seed"] == 0]
    assert [(s.state_id, s.snapshot) for s in bank] == [(s.state_id, s.snapshot) for s in first]
    for state in bank:
        assert state.provenance["teacher"] == "policy"
        turns = load_trajectory(bank.store, state)
        task = toy.task_of_state(state)
        assert [t.stage for t in turns] == [t.stage for t in toy.teacher_turns(task)]
    m = bank.manifest
    assert m["teacher"] == {"policy": ScriptedPolicy("teacher").identity()}
    assert m["labels"] == {"success": 2} and m["rejected"] == {}
    assert m["stages_without_turns"] == {}
    # verify() replays the recorded actions, not the benchmark's script.
    report = bank.verify()
    assert report.ok, report.table()
    assert report.checked["replay"] == len(bank)


def test_a_failing_policy_is_rejected_for_success_and_labelled_failure_when_asked(toy, tmp_path):
    # It plans, then only talks, and finishes: the verifier scores it low, and it
    # never reaches S3, S4 or S5.
    policy = Commands(["mkdir -p plan && printf '# Plan\\n' > plan/plan.md", "echo guess"])
    track = "threshold"
    only_success = build_bank(toy, tmp_path / "a", tracks=[track], teacher=policy)
    assert len(only_success) == 0
    assert only_success.manifest["rejected"] == {
        "success below 0.95 of the reward of a correct run": 1
    }
    assert only_success.manifest["trajectories"] == {"planned": 1, "kept": 0}

    bank = build_bank(
        toy,
        tmp_path / "b",
        tracks=[track],
        teacher=policy,
        outcomes=("success", "recovery", "failure"),
    )
    assert bank.manifest["unsupported_outcomes"] == ["recovery"]
    assert bank.manifest["labels"] == {"failure": 1}
    # E2E and S1 start at reset, S2 after the plan; the later stages had no turns.
    assert sorted(s.state_id.split(".", 1)[1] for s in bank) == [
        "E2E.failure",
        "S1.failure",
        "S2.failure",
    ]
    assert bank.manifest["stages_without_turns"] == {"S3": 1, "S4": 1, "S5": 1}
    assert StageBank(bank.root).verify().ok


def test_a_policy_that_never_finishes_or_does_not_replay_is_rejected(toy, tmp_path):
    endless = Commands(["true"] * 100)
    # The clock makes the plan differ between the episode and its replay, so verify()
    # could never reproduce the rows: rejected at build time.
    clock = Commands(["mkdir -p plan && date +%s%N > plan/plan.md", "true"])
    for name, policy, reason in (
        ("a", endless, "teacher ran out of budget"),
        ("b", clock, "replay differs from the policy's episode"),
    ):
        bank = build_bank(
            toy, tmp_path / name, tracks=["lookup"], teacher=policy, outcomes=("failure",)
        )
        assert bank.manifest["rejected"] == {reason: 1}, name
        assert len(bank) == 0


def test_cli_builds_with_a_policy_teacher(tmp_path):
    out = tmp_path / "b"
    args = ["bank", "build", "--out", str(out), "--benchmark", "toy_pipeline"]
    result = CliRunner().invoke(app, [*args, "--teacher", "teacher"])
    assert result.exit_code == 0, result.output
    assert "labelled by the verifier: {'success': 2}" in result.output
    assert StageBank(out).manifest["teacher"]["policy"]["kind"] == "scripted"
    bad = CliRunner().invoke(app, [*args, "--teacher", "nope:x"])
    assert bad.exit_code != 0 and "--teacher" in bad.output


@pytest.mark.parametrize("workers", [2])
def test_workers_build_the_same_bank(toy, toy_bank, tmp_path, workers):
    bank = build_bank(toy, tmp_path / "b", tasks_per_track=2, workers=workers)
    assert [(s.state_id, s.snapshot) for s in bank] == [(s.state_id, s.snapshot) for s in toy_bank]
    journal = (tmp_path / "b" / "rows.partial.jsonl").read_text().splitlines()
    assert len(journal) == 1 + 4  # the header and one record per task, one writer
