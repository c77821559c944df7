"""The rubric as an Inspect scorer: the sample episode's verdict as a ``Score``.

* ``value``: the episode's reward (0.0 for a null verdict, as the reward wrapper gives).
* ``explanation``: the verdict's one line with its failed items
  (:func:`bat_gym.viewer.export.score_explanation`, the same the export writes).
* ``metadata``: the stage credits, the overall, task and agentic scores, why the
  episode ended, and the contract.

A held-out cell (sample metadata ``heldout``) gets the numbers only: no explanation,
no contract (see the firewall in :mod:`~bat_gym.integrations.inspect.tasks`).

An episode still running when the scorer is called (an Inspect limit stopped the
sample first) is scored as it stands, with ``stop_reason`` ``inspect_limit``.
"""

from __future__ import annotations

import math
from typing import Any

from inspect_ai.scorer import (
    Metric,
    SampleScore,
    Score,
    Scorer,
    Target,
    mean,
    metric,
    scorer,
    stderr,
)
from inspect_ai.solver import TaskState

from bat_gym.integrations.inspect.agent import episode_of_sample
from bat_gym.viewer.export import score_explanation

__all__ = ["overall", "rubric_scorer", "task_score"]


def _metadata_mean(key: str, scores: list[SampleScore]) -> float:
    values = [
        s.score.metadata[key]
        for s in scores
        if s.score.metadata and s.score.metadata.get(key) is not None
    ]
    return sum(values) / len(values) if values else math.nan


@metric
def overall() -> Metric:
    """Mean overall score (the benchmark's mix of task and stage scores) of the scored samples."""

    def compute(scores: list[SampleScore]) -> float:
        return _metadata_mean("overall", scores)

    return compute


@metric
def task_score() -> Metric:
    """Mean task score of the samples whose task was scored."""

    def compute(scores: list[SampleScore]) -> float:
        return _metadata_mean("task", scores)

    return compute


@scorer(metrics=[mean(), stderr(), overall(), task_score()])
def rubric_scorer() -> Scorer:
    """Score the sample's episode with its stage's rubric contract (see the module)."""

    async def score(state: TaskState, target: Target) -> Score:
        from bat_gym.rubrics.verifier.scoring import overall_score

        episode = episode_of_sample()
        verdict = await episode.score()
        spec = episode.env.unwrapped.benchmark.spec  # type: ignore[attr-defined]
        metadata: dict[str, Any] = {
            "stages": {s.stage: s.credit for s in verdict.stages},
            "overall": overall_score(verdict.task_score, verdict.stage_score, spec),
            "task": verdict.task_score,
            "agentic": verdict.stage_score,
            "stop_reason": episode.stop_reason,
            "turns": episode.info.get("turns"),
            "tool_calls": episode.info.get("tool_calls"),
            "contract": f"{verdict.contract.id} {verdict.contract.version}",
        }
        value = 0.0 if episode.reward is None else episode.reward
        if state.metadata.get("heldout"):
            # The firewall: a held-out cell's score is numbers only (its reductions are
            # all of it a held-out log keeps); the contract's items name the task.
            del metadata["contract"]
            return Score(value=value, metadata=metadata)
        return Score(value=value, explanation=score_explanation(verdict), metadata=metadata)

    return score
