"""The scoring protocol as pure functions: items to stages, stages to agentic, to overall.

Every function states its formula; the code follows it line for line. ``None`` is a
null score (unscored because evidence could not be obtained), never zero: nulls are
excluded from every mean, and a mean over nothing is null. Weights come from the
:class:`~bat_gym.core.spec.BenchmarkSpec` (stage weights and ``task_weight``), never from
constants here. Scores are in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from bat_gym.core.spec import BenchmarkSpec

__all__ = [
    "stage_score",
    "level_score",
    "agentic_score",
    "overall_score",
    "e2e_reward",
    "track_means",
    "aggregate",
]


def _unit(value: float, what: str) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    return float(value)


def stage_score(
    passed: Sequence[bool | None], weights: Sequence[float] | None = None
) -> float | None:
    """Weighted mean of binary checklist items, null items excluded.

    ``score = sum_i w_i * x_i / sum_i w_i`` over items ``i`` with ``x_i`` in {0, 1};
    items with ``x_i = None`` are left out of both sums. Equal weights by default.

    Args:
        passed: per item, True (1), False (0) or None (null).
        weights: per item, >= 0; default all 1.

    Returns:
        The score, or None when no item is decided or the decided items weigh 0.

    >>> stage_score([True, False, None, True])
    0.6666666666666666
    """
    weights = [1.0] * len(passed) if weights is None else list(weights)
    if len(weights) != len(passed):
        raise ValueError(f"expected {len(passed)} weights, got {len(weights)}")
    if any(w < 0 for w in weights):
        raise ValueError(f"weights must be >= 0, got {weights}")
    decided = [(w, x) for w, x in zip(weights, passed, strict=True) if x is not None]
    total = sum(w for w, _ in decided)
    if total == 0:
        return None
    return sum(w * float(x) for w, x in decided) / total


def level_score(
    levels: Sequence[tuple[float, Sequence[str]]], passed: Mapping[str, bool | None]
) -> float | None:
    """The highest level reached, AutoMedBench style (e.g. 0 / 0.2 / 0.5 / 1.0).

    A level ``(score, required item ids)`` is reached when none of its items failed
    and, unless it requires nothing, at least one of them passed: null items are
    excluded, as in :func:`stage_score`. ``score = max(score_l for reached l)``, 0 when
    none is reached.

    Args:
        levels: ``(score, item ids)`` pairs.
        passed: the decision (True, False or None) of every item a level names.

    Returns:
        The score, or None when every item is null.

    >>> level_score([(0.0, []), (0.5, ["a"]), (1.0, ["a", "b"])], {"a": True, "b": False})
    0.5
    """
    if passed and all(x is None for x in passed.values()):
        return None
    reached = [
        _unit(score, "a level score")
        for score, required in levels
        if not any(passed[i] is False for i in required)
        and (not required or any(passed[i] is True for i in required))
    ]
    return max(reached, default=0.0)


def agentic_score(stage_scores: Mapping[str, float | None], spec: BenchmarkSpec) -> float | None:
    """Weighted stage scores, weights renormalized over applicable, non-null stages.

    ``agentic = sum_s w_s * x_s / sum_s w_s`` over stages ``s`` of ``spec`` that are
    applicable (a key of ``stage_scores``) and not null; ``w_s`` is the spec's stage
    weight. A stage left out of ``stage_scores`` is not applicable; a stage mapped to
    None is null. Both drop out of numerator and denominator alike.

    Returns:
        The score, or None when no applicable stage is scored (or their weights sum to 0).

    Raises:
        ValueError: a key is not a stage of ``spec``, or a score is outside [0, 1].
    """
    weights = {s.id: s.weight for s in spec.stages}
    unknown = sorted(set(stage_scores) - set(weights))
    if unknown:
        raise ValueError(f"{unknown} are not stages of {spec.name}; stages are {list(weights)}")
    scored = {s: _unit(x, f"stage {s} score") for s, x in stage_scores.items() if x is not None}
    total = sum(weights[s] for s in scored)
    if total == 0:
        return None
    return sum(weights[s] * x for s, x in scored.items()) / total


def overall_score(task: float | None, agentic: float | None, spec: BenchmarkSpec) -> float | None:
    """``overall = tw * task + (1 - tw) * agentic``, with ``tw = spec.task_weight``.

    A part whose weight is 0 may be null; otherwise a null part makes the whole null
    (the run could not be fully scored).
    """
    tw = spec.task_weight
    overall = 0.0
    if tw > 0:
        if task is None:
            return None
        overall += tw * _unit(task, "task score")
    if tw < 1:
        if agentic is None:
            return None
        overall += (1 - tw) * _unit(agentic, "agentic score")
    return overall


def e2e_reward(
    stage_credits: Mapping[str, float | None], task: float | None, spec: BenchmarkSpec
) -> float | None:
    """The reward of an E2E row: ``tw * task + (1 - tw) * weighted stage mean``.

    ``weighted stage mean = sum_s w_s * c_s / sum_s w_s`` over non-null stage credits
    (:func:`agentic_score`), and ``tw = spec.task_weight`` (0.5 in the reference): the
    same combination as :func:`overall_score`, applied to one rollout.
    """
    return overall_score(task, agentic_score(stage_credits, spec), spec)


def track_means(runs: Mapping[str, Sequence[float | None]]) -> dict[str, float | None]:
    """Per track, the mean over its repeats, nulls excluded.

    ``m_t = (1 / |R_t|) * sum_{r in R_t} x_{t,r}`` over non-null repeats ``R_t``;
    None for a track with no scored repeat.
    """
    means: dict[str, float | None] = {}
    for track, scores in runs.items():
        scored = [_unit(x, f"a {track} score") for x in scores if x is not None]
        means[track] = sum(scored) / len(scored) if scored else None
    return means


def aggregate(runs: Mapping[str, Sequence[float | None]]) -> float | None:
    """Mean over repeats within each track, then mean over the track means.

    ``A = (1 / |T|) * sum_{t in T} m_t`` over tracks ``T`` with a non-null mean ``m_t``
    (:func:`track_means`): tracks are the units, so a track with more repeats does not
    weigh more. None when no track is scored.

    >>> aggregate({"a": [1.0, 0.0, 1.0, 0.0], "b": [1.0]})
    0.75
    """
    means = [m for m in track_means(runs).values() if m is not None]
    return sum(means) / len(means) if means else None
