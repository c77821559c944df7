"""Radiology's recovery and failure rows: honest work wins each, by repairing in the open.

The two outcomes write the naive baseline's pipeline in S2 (stored values and
descriptions trusted). ``failure`` pilots it with a shape-only check and submits its
numbers. From a row that starts with that pipeline, the success teacher runs the model
card's check on a patient where a trap shows (it fails), writes the right pipeline,
pilots (and measures every patient) again, records each earlier file it changed in its
stage's receipt, and in S5 stores the marks and findings. Carrying the mistake on from
the same row is what the row must not pay.
"""

from __future__ import annotations

import pytest
from row_checks import LATER, RECEIPTS, play_teacher, repair_record, row_reward

from bat_gym.bank import build_bank
from bat_gym.envs.radiology import sandbox_code, teacher
from bat_gym.policies.scripted import ScriptedPolicy
from bat_gym.rubrics.verifier.reference import reference_workspace

pytestmark = pytest.mark.usefixtures("orthanc")

TRACK = "lesion_growth"


# The failure trajectory's rows: its S3 row starts as a recovery's does. The default
# bank (built by the reward audit) holds the other outcomes' rows.
MISTAKEN = ("failure",)


@pytest.fixture(scope="module")
def bank(radiology, tmp_path_factory):
    """The lesion_growth track's failure trajectory: 6 focuses."""
    assert set(MISTAKEN) < set(teacher.OUTCOMES)
    root = tmp_path_factory.mktemp("radiology") / "bank"
    return build_bank(radiology, root, tracks=[TRACK], outcomes=MISTAKEN)


def test_every_row_of_the_failure_is_admitted(radiology, bank):
    shares = bank.manifest["admission"]["shares"]
    assert len(bank.select()) == 6
    for focus, by_outcome in shares.items():
        assert set(by_outcome) == set(MISTAKEN), focus
        for outcome, cell in by_outcome.items():
            assert cell == {"admitted": 1, "rows": 1}, (focus, outcome)


@pytest.mark.parametrize(("focus", "outcome"), [("S3", "failure"), ("S4", "failure")])
def test_the_teacher_repairs_a_row_that_starts_with_the_mistake(radiology, bank, focus, outcome):
    (sid,) = bank.select(focus=focus, outcome=outcome)
    state = bank.get(sid)
    start, final = play_teacher(radiology, bank, state)
    assert start.read_bytes("pipeline/infer.py") == sandbox_code.naive_pipeline().encode()
    recorded = repair_record(start, final, RECEIPTS[focus], LATER[focus])
    assert "pipeline/infer.py" in recorded

    reference = reference_workspace(radiology, radiology.task_of_state(state))
    assert final["pipeline/infer.py"] == reference.read_bytes("pipeline/infer.py")
    if focus != "S3":
        assert final["outputs/predictions.csv"] == reference.read_bytes("outputs/predictions.csv")


def test_carrying_the_mistake_on_earns_nothing_and_the_repair_earns_everything(radiology, bank):
    (sid,) = bank.select(focus="S5", outcome="failure")

    assert row_reward(radiology, bank, sid, ScriptedPolicy("teacher", outcome="failure")) == 0.0
    assert row_reward(radiology, bank, sid, ScriptedPolicy("teacher")) == 1.0
