"""A failure row's S4 and S5 states are repair exercises: the teacher repairs in the open.

The failure trajectory piloted with the mistaken flag, and inference reuses the pilot's
settings. Played from its S4 or S5 state, the success teacher pilots again with the
right flag, re-runs inference, and records every earlier file it changed in its stage's
receipt. These tests hold the workspace to that: the record's sha256s are the start
state's and the final ones, nothing earlier changed off the record, and the outputs are
the reference run's.
"""

from __future__ import annotations

import pytest
from row_checks import play_teacher, repair_record

from bat_gym.rubrics.verifier.reference import reference_workspace

RECEIPTS = {"S4": "validation/s4_completion.json", "S5": "validation/s5_submission.json"}
# New files of the row's stage and the later ones are their work, not a repair.
OWN = {
    "S4": ("outputs/", RECEIPTS["S4"], RECEIPTS["S5"]),
    "S5": ("outputs/submission.csv", RECEIPTS["S5"]),
}


@pytest.mark.parametrize("focus", ["S4", "S5"])
@pytest.mark.parametrize("track", ["units", "cases", "codes"])
def test_the_teacher_repairs_a_failure_row_and_records_it(ladder, ladder_bank, track, focus):
    (sid,) = ladder_bank.select(focus=focus, track=track, outcome="failure")
    state = ladder_bank.get(sid)
    start, final = play_teacher(ladder, ladder_bank, state)
    recorded = repair_record(start, final, RECEIPTS[focus], OWN[focus])
    # The mistake lived in the pilot's settings; the receipt shows the failed check.
    assert {"validation/settings.json", "validation/s3_validation.json"} <= recorded

    task = ladder.task_of_state(state)
    reference = reference_workspace(ladder, task)
    outputs = ["outputs/predictions.csv"] + (["outputs/submission.csv"] if focus == "S5" else [])
    for path in outputs:
        assert final[path] == reference.read_bytes(path), path


def test_clean_rows_are_played_as_before(ladder):
    """Rows that start clean get no repair turns: the success script from their stage."""
    from bat_gym.envs.skill_ladder.tasks import draw
    from bat_gym.envs.skill_ladder.teacher import repair_turns

    d = draw("units", 0)
    for focus in ("S1", "S2", "S3", "S4", "S5"):
        for outcome in ("success", "recovery"):
            assert repair_turns(d, focus, outcome) == []
    assert repair_turns(d, "S3", "failure") == []  # the mistake is made in S3 itself
    assert repair_turns(d, "S4", "failure") and repair_turns(d, "S5", "failure")
