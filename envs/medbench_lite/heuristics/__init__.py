"""Model-free shortcuts per track: what an agent could score without the provided model.

Each track may have a module here named after it (``segmentation.py``, ...) with a
``HEURISTICS`` mapping of name to :data:`Heuristic`. A heuristic reads only the task's
public files (never ``model/``), writes whatever per-case files it needs under
``outputs/`` and returns the submission rows; :func:`score_heuristic` scores them with
the track's own metric. The suite's tests hold every heuristic to the bound that keeps
the provided model necessary, and ``benchmarks/medbench_scores.py`` reports them.
"""

from __future__ import annotations

import csv
import importlib
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["Heuristic", "heuristics", "score_heuristic"]

Heuristic = Callable[[Path, Sequence[str]], Mapping[str, Mapping[str, str]]]
"""``(workspace, case_ids) -> {case_id: submission row}``; files go under ``outputs/``."""


def heuristics(track: str) -> dict[str, Heuristic]:
    """The track's model-free heuristics by name; empty when the track has none."""
    try:
        module = importlib.import_module(f"{__name__}.{track}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{track}":
            raise
        return {}
    return dict(getattr(module, "HEURISTICS", {}))


def score_heuristic(benchmark, task, heuristic: Heuristic) -> float | None:
    """The task score of ``heuristic`` on ``task``: public files in, track metric out.

    Args:
        benchmark: the MedBench-Lite benchmark object (``write_public_files``,
            ``score_directory`` and ``draw``).
        task: the task to play.
        heuristic: the shortcut to score.
    """
    draw = benchmark.draw(task.track, task.seed, task.split)
    workspace = Path(tempfile.mkdtemp(prefix="bat-gym-heuristic-"))
    try:
        benchmark.write_public_files(task, workspace)
        shutil.rmtree(workspace / "model")  # a heuristic never sees the model
        (workspace / "outputs").mkdir(exist_ok=True)
        rows = heuristic(workspace, draw.case_ids)
        columns = list(draw.task_json["submission"]["columns"])
        with open(workspace / "outputs" / "submission.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for case in draw.case_ids:
                writer.writerow({"id": case, **dict(rows.get(case, {}))})
        return benchmark.score_directory(task, workspace)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
