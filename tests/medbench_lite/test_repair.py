"""Rows that start with the buggy pipeline are repair exercises: the teacher repairs in the open.

A failure trajectory writes the track's realistic mistake into ``pipeline/infer.py`` in
S2 and lets a shape-only pilot through. Played from its S3, S4 or S5 state, the success
teacher runs the track's quality check (which fails), writes the correct pipeline,
pilots (and infers) again, and records every earlier file it changed in its stage's
receipt. These tests hold the workspace to that: the record's sha256s are the start
state's and the final ones, nothing earlier changed off the record, and the outputs are
the reference run's.
"""

from __future__ import annotations

import pytest
from row_checks import LATER, RECEIPTS, play_teacher, repair_record

from bat_gym.bank import build_bank
from bat_gym.rubrics.verifier.reference import reference_workspace

from .conftest import TRACKS

FAST = "classification"  # the default run's track; the slow sweep takes every track


@pytest.fixture(scope="module")
def failure_bank(bench, tmp_path_factory):
    """track -> a bank of the failure trajectory's rows of one training task, built once."""
    banks = {}

    def bank(track):
        if track not in banks:
            root = tmp_path_factory.mktemp(track) / "bank"
            banks[track] = build_bank(bench, root, tracks=[track], outcomes=("failure",))
        return banks[track]

    return bank


def check_repair(bench, bank, track, focus):
    """Play the teacher from the failure row of ``bank`` and check the record and outputs."""
    (sid,) = bank.select(focus=focus, track=track, outcome="failure")
    state = bank.get(sid)
    start, final = play_teacher(bench, bank, state)
    recorded = repair_record(start, final, RECEIPTS[focus], LATER[focus])
    assert "pipeline/infer.py" in recorded  # the mistake lived in the pipeline

    reference = reference_workspace(bench, bench.task_of_state(state))
    assert final["pipeline/infer.py"] == reference.read_bytes("pipeline/infer.py")
    for path in ("outputs/predictions.csv", "outputs/submission.csv"):
        assert bench.files_agree(
            bench.task_of_state(state), path, final[path], reference.read_bytes(path)
        ), path


@pytest.mark.parametrize("focus", ["S3", "S4", "S5"])
def test_the_teacher_repairs_a_failure_row_and_records_it(bench, failure_bank, focus):
    check_repair(bench, failure_bank(FAST), FAST, focus)


@pytest.mark.slow
@pytest.mark.parametrize("focus", ["S3", "S4", "S5"])
@pytest.mark.parametrize("track", [t for t in TRACKS if t != FAST])
def test_every_track_repairs_its_failure_rows(bench, failure_bank, track, focus):
    check_repair(bench, failure_bank(track), track, focus)


def test_only_rows_after_the_mistake_are_repair_exercises():
    from bat_gym.envs.medbench_lite.teacher import carries_mistake

    assert [f for f in ("S1", "S2", "S3", "S4", "S5") if carries_mistake(f, "failure")] == [
        "S3",
        "S4",
        "S5",
    ]
    assert [f for f in ("S1", "S2", "S3", "S4", "S5") if carries_mistake(f, "recovery")] == ["S3"]
    assert not any(carries_mistake(f, "success") for f in ("S1", "S2", "S3", "S4", "S5"))
