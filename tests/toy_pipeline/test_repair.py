"""toy_pipeline's recovery and failure rows: honest work wins each, by repairing in the open.

The two outcomes write the track's realistic mistake into ``pipeline/infer.py`` in S2
(codes looked up as written; values taken as centimetres). ``failure`` lets a
shape-only pilot through and carries the mistake to the submission. Played from a row
that starts with that pipeline, the success teacher runs the S3 check (which fails),
writes the right pipeline, pilots (and infers) again and records every earlier file it
changed in its stage's receipt. The failure teacher's own work from the same row, which
keeps the mistake, is what the row must not pay.
"""

from __future__ import annotations

import pytest
from row_checks import LATER, RECEIPTS, play_teacher, repair_record, row_reward

from bat_gym.bank import build_bank
from bat_gym.envs.toy_pipeline import ToyPipeline, teacher
from bat_gym.policies.scripted import ScriptedPolicy
from bat_gym.rubrics.verifier.reference import reference_workspace

# The default training task of each track: the lookup task's codes carry the trap; the
# threshold task's values are in centimetres already, so its trap changes no score.
SEED = 0


@pytest.fixture(scope="module")
def toy():
    return ToyPipeline()


@pytest.fixture(scope="module")
def bank(toy, tmp_path_factory):
    """One training task per track, every outcome: 2 tracks x 3 outcomes x 6 focuses."""
    return build_bank(toy, tmp_path_factory.mktemp("toy") / "bank", outcomes=teacher.OUTCOMES)


def test_every_row_of_every_outcome_is_admitted(bank):
    shares = bank.manifest["admission"]["shares"]
    assert len(bank.select()) == 36
    assert set(shares) == {"E2E", "S1", "S2", "S3", "S4", "S5"}
    for focus, by_outcome in shares.items():
        assert set(by_outcome) == set(teacher.OUTCOMES), focus
        for outcome, cell in by_outcome.items():
            assert cell == {"admitted": 2, "rows": 2}, (focus, outcome)


@pytest.mark.parametrize(
    ("focus", "outcome"),
    [("S3", "recovery"), ("S3", "failure"), ("S4", "failure"), ("S5", "failure")],
)
def test_the_teacher_repairs_a_row_that_starts_with_the_mistake(toy, bank, focus, outcome):
    (sid,) = bank.select(focus=focus, track="lookup", outcome=outcome)
    state = bank.get(sid)
    start, final = play_teacher(toy, bank, state)
    assert b'get(r["code"], 0.0)' in start.read_bytes("pipeline/infer.py")  # the mistake
    recorded = repair_record(start, final, RECEIPTS[focus], LATER[focus])
    assert "pipeline/infer.py" in recorded

    reference = reference_workspace(toy, toy.task_of_state(state))
    assert final["pipeline/infer.py"] == reference.read_bytes("pipeline/infer.py")
    if focus != "S3":
        assert final["outputs/predictions.csv"] == reference.read_bytes("outputs/predictions.csv")


@pytest.mark.parametrize("focus", ["S4", "S5"])
def test_carrying_the_mistake_on_earns_nothing_and_the_repair_earns_everything(toy, bank, focus):
    (sid,) = bank.select(focus=focus, track="lookup", outcome="failure")
    # The failure trajectory's own stage work, from its own row: the mistake kept.
    assert row_reward(toy, bank, sid, ScriptedPolicy("teacher", outcome="failure")) == 0.0
    assert row_reward(toy, bank, sid, ScriptedPolicy("teacher")) == 1.0


def test_a_task_whose_trap_changes_no_score_has_nothing_to_repair(toy):
    task = toy.make_task("threshold", SEED, "train")
    assert toy._draw("threshold", SEED)["unit"] == "cm"
    for focus in ("S3", "S4", "S5"):
        assert toy.repair_turns(task, focus, "failure") == []
    # recovery has no mistake to recover from: its S3 keeps the pipeline, says why.
    recovery = [t for t in toy.teacher_script(task, "recovery") if t.stage == "S3"]
    assert len(recovery) == 2 and "CHECK OK" in recovery[1].content


def test_a_task_whose_trap_shows_gets_the_repair(toy):
    task = toy.make_task("lookup", SEED, "train")
    assert toy.repair_turns(task, "S3", "success") == []
    assert toy.repair_turns(task, "S2", "failure") == []
    assert toy.repair_turns(task, "S4", "recovery") == []  # recovery fixed it in S3
    for focus, outcome in (("S3", "recovery"), ("S3", "failure"), ("S4", "failure")):
        turns = toy.repair_turns(task, focus, outcome)
        assert turns and turns[-1].calls[0].name == "execute_code", (focus, outcome)
