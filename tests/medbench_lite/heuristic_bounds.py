"""The bound that keeps the provided model necessary, checked per track and tier.

For a set of tasks of one tier: the teacher's task score ``t`` (its pipeline, run on
the task's public files), the naive baseline's ``n`` (its naive pipeline) and each
model-free heuristic's ``h`` (:func:`~bat_gym.envs.medbench_lite.heuristics.score_heuristic`),
each the mean over the tasks. The bound is ``h - n <= 0.5 * (t - n)``: the best
heuristic scores at most half of the teacher's margin over the naive floor.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics import heuristics, score_heuristic
from bat_gym.envs.medbench_lite.tracks import get_track

__all__ = ["pipeline_score", "tier_scores", "bound", "assert_bound"]


def pipeline_score(bench, task, code: str) -> float:
    """The task score of a recipe pipeline (``infer.py`` source) run on every case."""
    draw = bench.draw(task.track, task.seed, task.split)
    out_dir = get_track(task.track).recipe().out_dir
    ws = Path(tempfile.mkdtemp(prefix="bat-gym-bound-"))
    try:
        bench.write_public_files(task, ws)
        (ws / "pipeline").mkdir(exist_ok=True)
        (ws / "outputs").mkdir(exist_ok=True)
        (ws / "pipeline" / "infer.py").write_text(code)
        subprocess.run(
            [
                sys.executable,
                "pipeline/infer.py",
                "outputs/submission.csv",
                out_dir,
                *draw.case_ids,
            ],
            cwd=ws,
            check=True,
            capture_output=True,
            timeout=600,
        )
        return float(bench.score_directory(task, ws) or 0.0)
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def tier_scores(bench, track: str, seeds, split: str = "heldout") -> dict[str, float]:
    """Mean teacher, naive and per-heuristic scores over ``seeds`` (one tier's seeds).

    Scored once per benchmark, track, seeds and split: two tests judge the same scores.
    """
    key = (id(bench), track, tuple(seeds), split)
    if key not in _SCORES:
        _SCORES[key] = _tier_scores(bench, track, seeds, split)
    return dict(_SCORES[key])


_SCORES: dict[tuple, dict[str, float]] = {}


def _tier_scores(bench, track: str, seeds, split: str) -> dict[str, float]:
    recipe = get_track(track).recipe()
    rows: dict[str, list[float]] = {}
    for seed in seeds:
        task = bench.make_task(track, seed, split)
        rows.setdefault("teacher", []).append(pipeline_score(bench, task, recipe.pipeline))
        rows.setdefault("naive", []).append(pipeline_score(bench, task, recipe.naive_pipeline))
        for name, h in heuristics(track).items():
            rows.setdefault(name, []).append(float(score_heuristic(bench, task, h) or 0.0))
    return {k: float(np.mean(v)) for k, v in rows.items()}


def bound(scores: dict[str, float]) -> float:
    """The most a heuristic may score: naive + half the teacher's margin over naive."""
    return scores["naive"] + 0.5 * (scores["teacher"] - scores["naive"])


def assert_bound(bench, track: str, seeds, split: str = "train") -> dict[str, float]:
    """Fail when a heuristic of ``track`` scores more than half the teacher's margin."""
    scores = tier_scores(bench, track, seeds, split)
    limit = bound(scores)
    over = {k: v for k, v in scores.items() if k not in ("teacher", "naive") and v > limit}
    assert not over, (track, list(seeds), round(limit, 3), scores)
    return scores
