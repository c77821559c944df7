"""The paper's comparison as a study: arms x seeds, each a cached, resumable unit.

``bat-gym study run STUDY.yaml [--quick]`` runs Baseline, SFT, GRPO E2E-only, BiCuRL
with the three-pool mix and its three drop-one-pool arms on the tiny local model, all
RL arms from one SFT checkpoint at one generated-token budget, and writes a results
file, a table and plots (``bat-gym study report DIR`` rebuilds them).

* :mod:`.config`: :class:`StudyConfig` and :func:`load_study` (torch-free);
* :mod:`.arms`: the arms and what one unit of each runs;
* :mod:`.units`: a unit's folder, lock and done marker;
* :mod:`.runner`: :func:`run_study`;
* :mod:`.report` and :mod:`.plots`: the results, their CIs and the PNGs.
"""

from __future__ import annotations

from typing import Any

from bat_gym.trainers.study.config import ARM_NAMES, StudyConfig, load_study

__all__ = ["ARM_NAMES", "StudyConfig", "load_study", "run_study", "write_report"]


def __getattr__(name: str) -> Any:
    # The runner and report bring numpy and, through the trainers, torch: loaded on use.
    if name == "run_study":
        from bat_gym.trainers.study.runner import run_study

        return run_study
    if name == "write_report":
        from bat_gym.trainers.study.report import write_report

        return write_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
