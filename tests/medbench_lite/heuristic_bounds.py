"""The bound that keeps the provided model necessary, checked per track and tier.

For a set of tasks of one tier: the teacher's task score ``t`` (its pipeline, run on
the task's public files), the naive baseline's ``n`` (its naive pipeline) and each
model-free heuristic's ``h`` (:func:`~bat_gym.envs.medbench_lite.heuristics.score_heuristic`),
each the mean over the tasks. The bound is ``h - n <= 0.5 * (t - n)``.
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

__all__ = ["pipeline_score", "tier_scores", "assert_bound"]


def pipeline_score(bench, task, naive: bool = False) -> float:
    """The task score of the teacher's (or the naive) pipeline, run on every case."""
    recipe = get_track(task.track).recipe()
    ws = Path(tempfile.mkdtemp(prefix="bat-gym-bound-"))
    try:
        bench.write_public_files(task, ws)
        (ws / "pipeline").mkdir()
        (ws / "outputs").mkdir()
        code = recipe.naive_pipeline if naive else recipe.pipeline
        (ws / "pipeline" / "infer.py").write_text(code)
        subprocess.run(
            [sys.executable, "pipeline/infer.py", "outputs/submission.csv", recipe.out_dir],
            cwd=ws,
            check=True,
            capture_output=True,
            timeout=600,
        )
        return float(bench.score_directory(task, ws))
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def tier_scores(bench, track: str, seeds) -> dict[str, float]:
    """Mean task scores over ``seeds`` (training split): teacher, naive, each heuristic."""
    tasks = [bench.make_task(track, s, "train") for s in seeds]
    out = {
        "teacher": float(np.mean([pipeline_score(bench, t) for t in tasks])),
        "naive": float(np.mean([pipeline_score(bench, t, naive=True) for t in tasks])),
    }
    for name, h in heuristics(track).items():
        out[name] = float(np.mean([score_heuristic(bench, t, h) for t in tasks]))
    return out


def assert_bound(bench, track: str, seeds) -> dict[str, float]:
    """Fail when a heuristic of ``track`` scores more than half the teacher's gain."""
    scores = tier_scores(bench, track, seeds)
    t, n = scores["teacher"], scores["naive"]
    over = {
        k: v for k, v in scores.items() if k not in ("teacher", "naive") and v - n > 0.5 * (t - n)
    }
    assert not over, (track, list(seeds), scores)
    return scores
