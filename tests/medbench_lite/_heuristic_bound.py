"""Scoring the teacher, the naive baseline and the model-free heuristics of one task.

The bound the heuristics are held to: on every track and tier, the best heuristic
scores at most half of the teacher's task score above the naive floor,
``h - naive <= 0.5 * (teacher - naive)`` (means over the tier's seeds), so the
provided model stays necessary.
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

__all__ = ["pipeline_score", "tier_scores", "bound"]


def pipeline_score(bench, task, code: str) -> float:
    """The task score of a recipe pipeline (``infer.py`` source) run on the task's files."""
    draw = bench.draw(task.track, task.seed, task.split)
    ws = Path(tempfile.mkdtemp(prefix="bat-gym-bound-"))
    try:
        bench.write_public_files(task, ws)
        (ws / "pipeline").mkdir(exist_ok=True)
        (ws / "pipeline" / "infer.py").write_text(code)
        out_dir = get_track(task.track).recipe().out_dir
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
        )
        return float(bench.score_directory(task, ws) or 0.0)
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def tier_scores(bench, track: str, seeds, split: str = "heldout") -> dict[str, float]:
    """Mean teacher, naive and per-heuristic scores over ``seeds`` (one tier's seeds)."""
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
