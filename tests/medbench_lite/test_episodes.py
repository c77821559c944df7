"""Real episodes in a local sandbox: the teacher catches each trap, the naive baseline does not."""

import csv
import json

import pytest

from bat_gym.envs.medbench_lite.tracks.base import STAGE_ARTIFACTS

from .conftest import NAIVE_MAX, TEACHER_MIN, TEACHER_MIN_HARD, TRACKS, check_receipt, replay

SEED = 2


def _rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.mark.parametrize("track", TRACKS)
def test_teacher_succeeds_and_naive_falls_into_the_trap(bench, track, tmp_path):
    task = bench.make_task(track, SEED, "train")
    turns = bench.teacher_turns(task)
    assert turns[-1].calls[-1].name == "finish"
    assert [t.stage for t in turns] == sorted(t.stage for t in turns)  # stage by stage
    n_calls = sum(len(t.calls) for t in turns)
    assert (
        len(turns) <= bench.spec.budgets.max_turns and n_calls <= bench.spec.budgets.max_tool_calls
    )

    ep = replay(bench, task, turns, keep=tmp_path / "teacher")
    failed = [(stage, r.output[-800:]) for stage, r in ep.results if not r.ok]
    assert not failed, failed
    assert ep.score >= TEACHER_MIN[track], ep.score

    ws = ep.workspace
    for stage, paths in STAGE_ARTIFACTS.items():
        for p in paths:
            assert (ws / p).is_file(), f"{stage} artifact {p} missing"
    plan = (ws / "plan/plan.md").read_text()
    assert all(h in plan for h in ("## Preprocess", "## Inference", "## Postprocess"))
    for path, stage in (
        ("model/checkpoint.json", "S2"),
        ("setup/model_load.json", "S2"),
        ("validation/s3_validation.json", "S3"),
        ("validation/s4_completion.json", "S4"),
        ("validation/s5_submission.json", "S5"),
    ):
        check_receipt(ws, path, stage)
    s3 = json.loads((ws / "validation/s3_validation.json").read_text())
    assert s3["artifact"] == "validation/pilot.csv" and s3["passed"] and s3["checks"]
    header, pilot = _rows(ws / "validation/pilot.csv")
    assert header[0] == "id" and len(pilot) == 1
    schema = json.loads((ws / "task.json").read_text())["submission"]
    for name in ("outputs/predictions.csv", "outputs/submission.csv"):
        header, rows = _rows(ws / name)
        assert header[0] == "id" and sorted(r["id"] for r in rows) == sorted(schema["case_ids"])
    header, rows = _rows(ws / "outputs/submission.csv")
    assert header == schema["columns"] and [r["id"] for r in rows] == schema["case_ids"]
    assert json.loads((ws / "validation/s4_completion.json").read_text())["missing"] == []

    naive = replay(bench, task, bench.naive_turns(task))
    assert all(r.ok for _, r in naive.results), [r.output[-500:] for _, r in naive.results]
    assert naive.score <= NAIVE_MAX[track] and naive.score < ep.score - 0.15, (
        naive.score,
        ep.score,
    )


@pytest.mark.slow
@pytest.mark.parametrize("track", TRACKS)
def test_recovery_catches_the_mistake_at_s3_and_failure_keeps_it(bench, track):
    task = bench.make_task(track, SEED + 1, "train")
    rec = replay(bench, task, bench.teacher_turns(task, "recovery"))
    s3 = [r for stage, r in rec.results if stage == "S3"]
    assert not s3[0].ok and "FAIL" in s3[0].output, s3[0].output  # the quality check saw it
    assert all(r.ok for r in s3[1:]) and "PASS" in s3[-1].output
    assert all(r.ok for stage, r in rec.results if stage != "S3")
    hard = task.params.get("difficulty") == "hard"  # seed 3: the hard tier where tracks have one
    assert rec.score >= (TEACHER_MIN_HARD if hard else TEACHER_MIN[track])
    fail = replay(bench, task, bench.teacher_turns(task, "failure"))
    assert all(r.ok for _, r in fail.results)  # the shape-only check lets the mistake through
    assert fail.score <= NAIVE_MAX[track] and fail.score < rec.score - 0.15


def test_missing_or_incomplete_submission_scores_zero(bench, tmp_path):
    task = bench.make_task("classification", SEED, "train")
    assert bench.score_directory(task, tmp_path) == 0.0
    (tmp_path / "outputs").mkdir()
    ids = json.loads(json.dumps(bench.draw("classification", SEED, "train").case_ids))
    rows = "".join(f"{i},0,0.9\n" for i in ids[:-1])
    (tmp_path / "outputs/submission.csv").write_text("id,label,confidence\n" + rows)
    assert bench.score_directory(task, tmp_path) == 0.0
    (tmp_path / "outputs/submission.csv").write_text("label,id,confidence\n")
    assert bench.score_directory(task, tmp_path) == 0.0


def test_outcome_is_checked(bench):
    task = bench.make_task("vqa", 0, "train")
    with pytest.raises(ValueError, match="outcome"):
        bench.teacher_turns(task, "maybe")
    stages = [t.stage for t in bench.teacher_turns(task, "recovery")]
    assert (
        stages.count("S3") == 2
        and [t.stage for t in bench.teacher_turns(task, "failure")].count("S3") == 1
    )
