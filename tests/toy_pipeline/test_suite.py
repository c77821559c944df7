"""The toy suite's tasks and metric: a trap-missing or guessing pipeline earns little."""

import math
import subprocess
import sys

import pytest

from bat_gym.core.sandbox import BlobStore
from bat_gym.envs.toy_pipeline.suite import AGREEMENT, score_agreement
from bat_gym.envs.toy_pipeline.teacher import MISTAKEN_PIPELINE, PIPELINE
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

TRACKS = ("threshold", "lookup")
SEEDS = range(1_000_000, 1_000_040)


def _frozen(tmp_path, files: dict[str, bytes | str]) -> FrozenWorkspace:
    return FrozenWorkspace.from_files(BlobStore(tmp_path / "blobs"), files)


@pytest.mark.parametrize(
    ("text", "complete", "expected"),
    [
        ("id,score\na,0.1234\nb,0.5000\n", True, 1.0),
        ("id,score\nb,0.5000\na,0.1234\n", True, 1.0),  # order is free
        ("id,score\na,0.12345\nb,0.50009\n", True, 1.0),  # within the agreement
        ("id,score\na,0.1236\nb,0.5\n", True, 0.5),  # 2e-4 off
        ("id,score\na,0.1234\n", True, 0.0),  # a submission missing a case
        ("id,score\na,0.1234\n", False, 1.0),  # a pilot scores its own rows
        ("id,score\na,0.1234\nz,0.1\n", False, 0.0),  # a row naming no case
        ("id,score\na,0.1234\na,0.1234\nb,0.5\n", True, 0.0),  # an id twice
        ("id,label\na,0.1234\nb,0.5\n", True, 0.0),  # not the schema
        ("id,score\na,nan\nb,inf\n", True, 0.0),  # not finite
        ("id,score\na,1e400\nb,high\n", True, 0.0),  # overflow and text, never a raise
        ("id,score\n", True, 0.0),
    ],
)
def test_score_agreement(text, complete, expected, tmp_path):
    ws = _frozen(tmp_path, {"s.csv": text})
    truth = {"a": 0.1234, "b": 0.5}
    assert score_agreement(ws, "s.csv", truth, complete=complete) == expected


def test_a_missing_or_binary_file_scores_zero(tmp_path):
    ws = _frozen(tmp_path, {"bad.csv": "x", "bin.csv": b"\xff\xfe\x00id,score"})
    for path in ("missing.csv", "bad.csv", "bin.csv"):
        assert score_agreement(ws, path, {"a": 0.5}, complete=True) == 0.0


def _run(code: str, workspace, out: str) -> None:
    script = workspace / "infer.py"
    script.write_text(code)
    subprocess.run([sys.executable, str(script), out], cwd=workspace, check=True)


def _task_score(toy, task, workspace, out) -> float:
    ws = _frozen(workspace.parent, {out: (workspace / out).read_bytes()})
    truth = toy.private_answers(task)["scores"]
    return score_agreement(ws, out, truth, complete=True)


@pytest.mark.parametrize("track", TRACKS)
def test_the_trap_changes_most_scores_and_guesses_agree_with_none(toy, track, tmp_path):
    """The teacher's pipeline agrees on every case; the naive one only where the trap
    does not show (values already in cm, codes written as the table has them); a
    constant or a guessed score on almost none."""
    teacher, naive, constant = [], [], []
    for seed in SEEDS:
        task = toy.make_task(track, seed, "heldout")
        ws = tmp_path / f"{track}-{seed}"
        ws.mkdir()
        toy.write_public_files(task, ws)
        _run(PIPELINE[track], ws, "teacher.csv")
        _run(MISTAKEN_PIPELINE[track], ws, "naive.csv")
        teacher.append(_task_score(toy, task, ws, "teacher.csv"))
        naive.append(_task_score(toy, task, ws, "naive.csv"))
        truth = toy.private_answers(task)["scores"]
        for guess in (0.0, 0.25, 0.5, 0.75, 1.0):
            rows = "".join(f"{case},{guess:.4f}\n" for case in truth)
            (ws / "c.csv").write_text("id,score\n" + rows)
            constant.append(_task_score(toy, task, ws, "c.csv"))
    assert min(teacher) == 1.0
    assert 0.1 < sum(naive) / len(naive) < 0.6, naive
    assert max(constant) <= 0.25 and sum(constant) / len(constant) < 0.02, constant


@pytest.mark.parametrize("track", TRACKS)
def test_scores_are_continuous(toy, track):
    for seed in SEEDS:
        scores = list(toy.private_answers(toy.make_task(track, seed, "heldout"))["scores"].values())
        assert all(0.0 < s < 1.0 and math.isfinite(s) for s in scores)
        assert AGREEMENT < 1e-3
