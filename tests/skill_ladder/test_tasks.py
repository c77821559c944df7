"""Generation, guarantees, metrics, prompts and the shipped tool, without a sandbox."""

import hashlib
import json
import subprocess
import sys

import pytest

from bat_gym.core.protocol import get_protocol
from bat_gym.core.sandbox import BlobStore
from bat_gym.envs.skill_ladder import pipe
from bat_gym.envs.skill_ladder.tasks import draw, label_accuracy
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

from .conftest import HELDOUT, TRACKS

SEEDS = [*range(100), *range(HELDOUT, HELDOUT + 100)]


def _files(bench, task, dest):
    bench.write_public_files(task, dest)
    return {
        str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("track", TRACKS)
def test_generation_is_deterministic_and_splits_differ(ladder, track, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    task = ladder.make_task(track, HELDOUT, "heldout")
    assert task == ladder.make_task(track, HELDOUT, "heldout")
    assert _files(ladder, task, a) == _files(ladder, task, b)
    assert ladder.private_answers(task) == ladder.private_answers(task)
    train = ladder.make_task(track, 0, "train")
    assert train.task_id != task.task_id and str(HELDOUT) not in task.task_id
    with pytest.raises(ValueError, match="not in the heldout range"):
        ladder.make_task(track, 5, "heldout")


@pytest.mark.parametrize("track", TRACKS)
def test_the_choice_varies_and_classes_are_balanced(track):
    draws = [draw(track, s) for s in SEEDS]
    choices = {d.choice for d in draws}
    assert len(choices) >= 2, choices  # both units, both fixes, many phantom ids
    for d in draws:
        n, positives = len(d.labels), sum(d.labels.values())
        assert 4 <= n <= 6 and n / 3 <= positives <= 2 * n / 3
        assert [r["id"] for r in d.rows if r["id"] in d.labels] == list(d.case_ids)
        if track == "cases":
            assert d.rows[0]["id"] != d.choice and d.choice in [r["id"] for r in d.rows]
            assert d.choice not in d.labels and d.choice in d.card


def _tool_task(ladder, track, seed, tmp_path, monkeypatch):
    ws = tmp_path / f"{track}-{seed}"
    ws.mkdir()
    task = ladder.make_task(track, seed, "train" if seed < HELDOUT else "heldout")
    ladder.write_public_files(task, ws)
    monkeypatch.chdir(ws)
    return pipe.Task(), draw(track, seed)


def _accuracy(tool_task, d, settings):
    labels = [tool_task.label(c, settings) for c in d.case_ids]
    return sum(y == d.labels[c] for y, c in zip(labels, d.case_ids, strict=True)) / len(labels)


@pytest.mark.parametrize("track", TRACKS)
def test_the_right_flag_is_exact_and_every_wrong_one_shows(ladder, track, tmp_path, monkeypatch):
    """The tool's own logic on generated files: right flag 1.0; wrong flags fail the
    pilot's check, get the default pilot case wrong and score at most 2/3."""
    wrong_flags = {
        "units": lambda d: [{"unit": "cm" if d.choice == "mm" else "mm"}],
        "cases": lambda d: [{"case": c} for c in d.case_ids],
        "codes": lambda d: [{"codes": f} for f in pipe.FIXES if f != d.choice],
    }[track]
    flag = {"units": "unit", "cases": "case", "codes": "codes"}[track]
    for seed in SEEDS:
        tool, d = _tool_task(ladder, track, seed, tmp_path, monkeypatch)
        right = tool.settings(**{"case": None, "unit": None, "codes": None, flag: d.choice})
        assert _accuracy(tool, d, right) == 1.0
        assert all(ok for ok, _ in pipe._checks(tool, right))
        pilot = right["case"]
        assert tool.label(pilot, right) == {**d.labels, **d.examples}[pilot]
        for wrong in wrong_flags(d):
            settings = tool.settings(**{"case": None, "unit": None, "codes": None, **wrong})
            assert _accuracy(tool, d, settings) <= 2 / 3, (seed, wrong)
            assert not all(ok for ok, _ in pipe._checks(tool, settings)), (seed, wrong)
            first = d.case_ids[0]
            if track != "cases":  # in cases a wrong pilot is off the phantom altogether
                assert tool.label(first, settings) != d.labels[first], (seed, wrong)
        if track == "codes":
            assert pipe._code_fix(tool) == d.choice
        if track == "cases":  # no pilot at all: nothing calibrated
            assert _accuracy(tool, d, {**right, "scale": 1.0}) <= 2 / 3


def _ws(files, tmp_path):
    return FrozenWorkspace.from_files(BlobStore(tmp_path / "store"), files)


@pytest.mark.parametrize(
    ("text", "columns", "expected"),
    [
        ("id,label\nc01,1\nc02,0\n", ["id", "label"], 1.0),
        ("id,label\nc02,0\nc01,0\n", ["id", "label"], 0.5),  # order is free, labels are not
        ("id,label\nc01,1\n", ["id", "label"], 0.0),  # a missing case
        ("id,label,x\nc01,1,a\nc02,0,b\n", ["id", "label"], 0.0),  # not the schema
        ("id,label,x\nc01,1,a\nc02,0,b\n", None, 1.0),
        ("id,label\nc01,1\nc01,1\nc02,0\n", None, 0.0),  # an id twice
        ("id,label\nc01,yes\nc02,0\n", None, 0.5),
        ("", None, 0.0),
    ],
)
def test_label_accuracy(text, columns, expected, tmp_path):
    ws = _ws({"s.csv": text}, tmp_path)
    truth = {"c01": 1, "c02": 0}
    assert label_accuracy(ws, "s.csv", truth, scored=list(truth), columns=columns) == expected


def test_pilot_score_names_the_phantom_in_cases(ladder, tmp_path):
    task = ladder.make_task("cases", HELDOUT, "heldout")
    d = draw("cases", HELDOUT)
    first = d.case_ids[0]
    cases = {
        f"id,label\n{d.choice},0\n": 1.0,
        f"id,label\n{first},{d.labels[first]}\n": 0.0,  # right label, but not the calibration run
        f"id,label\n{d.choice},1\n": 0.0,
        "id,label\nc00,0\n": 0.0,
    }
    for text, expected in cases.items():
        assert ladder.pilot_score(task, _ws({"p.csv": text}, tmp_path), "p.csv") == expected, text
    units = ladder.make_task("units", HELDOUT, "heldout")
    du = draw("units", HELDOUT)
    row = f"id,label\n{du.case_ids[1]},{du.labels[du.case_ids[1]]}\n"
    assert ladder.pilot_score(units, _ws({"p.csv": row}, tmp_path), "p.csv") == 1.0


def test_reduced_tasks_keep_the_flag_and_pilot_case(ladder, tmp_path):
    for track in TRACKS:
        task = ladder.make_task(track, 7, "train")
        small = ladder.reduce_task(task, max_cases=2)
        assert small.task_id != task.task_id and small.card == task.card
        assert ladder.task_of(track, 7, "train", {"max_cases": 2}) == small
        answers = ladder.private_answers(small)
        assert len(answers["labels"]) == 2
        files = _files(ladder, small, tmp_path / track)
        meta = json.loads(files["task.json"])
        assert meta["submission"]["case_ids"] == list(answers["labels"])
        ids = [line.split(",")[0] for line in files["data/cases.csv"].decode().split()[1:]]
        assert set(ids) == set(answers["labels"]) | set(answers["examples"])
        with pytest.raises(ValueError, match="already reduced"):
            ladder.reduce_task(small, max_cases=1)


def test_prompts_are_short(ladder):
    proto = get_protocol("hermes")
    for track in TRACKS:
        for seed in (0, 1, HELDOUT):
            task = ladder.make_task(track, seed, "train" if seed < HELDOUT else "heldout")
            for focus in ladder.spec.focuses:
                size = len(ladder.system_prompt(focus, proto)) + len(
                    ladder.user_prompt(task, focus)
                )
                assert size <= 1000, (track, focus, size)
    for stage in ladder.spec.stages:
        assert len(stage.skill) <= 300, stage.id


def _run(ws, *args):
    # -S: the tool needs only the standard library, and skipping site-packages keeps
    # each call as fast as it is inside the sandbox.
    return subprocess.run(
        [sys.executable, "-S", *args], cwd=ws, capture_output=True, text=True, timeout=30
    )


def _receipt_ok(ws, path, stage):
    receipt = json.loads((ws / path).read_text())
    digest = hashlib.sha256((ws / receipt["artifact"]).read_bytes()).hexdigest()
    return (
        receipt["stage"] == stage and receipt["schema_version"] == 1 and receipt["sha256"] == digest
    )


def test_the_tool_writes_every_artifact_with_a_true_receipt(ladder, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    task = ladder.make_task("codes", 3, "train")
    ladder.write_public_files(task, ws)
    d = draw("codes", 3)
    refused = _run(ws, "tool/pipe.py", "validation/pilot.csv")
    assert refused.returncode == 2 and "tool/pipe.py setup" in refused.stderr
    assert _run(ws, "tool/pipe.py", "plan").returncode == 0
    assert "## Inference" in (ws / "plan/plan.md").read_text()
    assert _run(ws, "tool/pipe.py", "setup").returncode == 0
    assert (ws / "pipeline/infer.py").read_bytes() == (ws / "tool/pipe.py").read_bytes()
    refused = _run(ws, "tool/pipe.py", "outputs/predictions.csv")
    assert (
        refused.returncode == 2
        and "python pipeline/infer.py outputs/predictions.csv" in refused.stderr
    )
    late = _run(ws, "pipeline/infer.py", "outputs/submission.csv")
    assert late.returncode == 2 and "outputs/predictions.csv first" in late.stderr
    check = _run(ws, "pipeline/infer.py", "check")
    assert f"--codes {d.choice}" in check.stdout and not (ws / "validation").exists()
    bad = _run(ws, "pipeline/infer.py", "validation/pilot.csv")
    assert (
        bad.returncode == 0 and "CHECK FAILED" in bad.stdout and f"--codes {d.choice}" in bad.stdout
    )
    good = _run(ws / "pipeline", "infer.py", "validation/pilot.csv", "--codes", d.choice)
    assert good.returncode == 0 and "CHECK OK" in good.stdout, good.stdout + good.stderr
    assert _run(ws, "pipeline/infer.py", "outputs/predictions.csv").returncode == 0
    assert _run(ws, "pipeline/infer.py", "outputs/submission.csv").returncode == 0
    for path, stage in (
        ("validation/s3_validation.json", "S3"),
        ("validation/s4_completion.json", "S4"),
        ("validation/s5_submission.json", "S5"),
    ):
        assert _receipt_ok(ws, path, stage), path
    lines = (ws / "outputs/submission.csv").read_text().split()
    assert lines[0] == "id,label"
    assert lines[1:] == [f"{c},{d.labels[c]}" for c in d.case_ids]
