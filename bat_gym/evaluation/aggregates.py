"""The firewall: the only evaluation output training may read.

:func:`aggregate` turns cell results into :class:`Aggregates`, a type that can hold
only aggregate stage and task scores, per-track aggregates (so the gate can compute
track changes), completion counts, failure-category counts and the same aggregates per difficulty tier.
Every string in it is a stage id, a track name, a tier name or a member of a closed
set, each held to a pattern; there is no
free-text field, so no task id, path, answer, message or log can be written into
``aggregates.json``, by mistake or otherwise. The type is ``extra="forbid"``: reading
back a file with any other field fails.

Cells are paired by :attr:`Aggregates.cells_digest`, a one-way digest of the cell set,
so a gate can refuse to compare runs over different cells without learning which.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bat_gym.core.files import write_atomic
from bat_gym.core.spec import BenchmarkSpec
from bat_gym.evaluation.cells import FAILURE_CATEGORIES, CellResult, FailureCategory
from bat_gym.rubrics.verifier.scoring import aggregate as mean_of_tracks

__all__ = [
    "Aggregates",
    "TrackAggregate",
    "TierAggregate",
    "CompletionCounts",
    "aggregate",
    "cells_digest",
]

StageId = Annotated[str, StringConstraints(pattern=r"^S[1-9][0-9]?$")]
TrackName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
TierName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,19}$")]
Score = Annotated[float, Field(ge=0.0, le=1.0)]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class CompletionCounts(BaseModel):
    """How many runs there were and how they ended."""

    model_config = _STRICT

    runs: int = Field(ge=0, description="Cells evaluated.")
    valid: int = Field(ge=0, description="Cells whose infrastructure worked.")
    invalid: int = Field(ge=0, description="Cells lost to infrastructure; a gate refuses any.")
    finished: int = Field(ge=0, description="Valid runs that called finish.")
    scored: int = Field(ge=0, description="Valid runs with a non-null overall score.")


class TrackAggregate(BaseModel):
    """One track's means over its repeats."""

    model_config = _STRICT

    overall: Score | None
    task: Score | None
    stages: dict[StageId, Score | None]
    completion: CompletionCounts


class TierAggregate(BaseModel):
    """One difficulty tier's aggregates: the overall's formula over that tier's cells only.

    ``overall = mean_t mean_r x_{t,r}`` over the tracks with cells of the tier and,
    within a track, its repeats of that tier; ``tracks`` holds those track means.
    """

    model_config = _STRICT

    overall: Score | None
    task: Score | None
    agentic: Score | None
    stages: dict[StageId, Score | None]
    tracks: dict[TrackName, TrackAggregate]
    completion: CompletionCounts


class Aggregates(BaseModel):
    """Aggregate scores of one evaluation: tracks are the units (mean of track means).

    ``tiers`` repeats them per difficulty tier (empty when no task carries a tier); the
    top-level figures pool every tier, as the paper aggregates: the mean over tracks of
    the mean over each track's repeats.
    """

    model_config = _STRICT

    schema_version: Literal[1] = 1
    overall: Score | None
    task: Score | None
    agentic: Score | None
    stages: dict[StageId, Score | None]
    tracks: dict[TrackName, TrackAggregate]
    completion: CompletionCounts
    failures: dict[FailureCategory, int]
    tiers: dict[TierName, TierAggregate] = Field(default_factory=dict)
    cells_digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]

    @property
    def valid(self) -> bool:
        """True when no cell was lost to infrastructure (the gate's precondition)."""
        return self.completion.invalid == 0

    def write(self, path: str | Path) -> None:
        """Write as JSON (atomic: a reader never sees half a file)."""
        write_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> Aggregates:
        """Read and validate ``aggregates.json`` (any extra field is refused)."""
        from bat_gym.core.spec import load_model

        return load_model(cls, Path(path))


def cells_digest(results: Sequence[CellResult]) -> str:
    """sha256 over the sorted cell keys and task ids: equal iff the cells are paired."""
    keys = sorted(f"{r.cell.key}\t{r.task_id}" for r in results)
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def _mean(values: Sequence[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _counts(results: Sequence[CellResult]) -> CompletionCounts:
    valid = [r for r in results if r.valid]
    return CompletionCounts(
        runs=len(results),
        valid=len(valid),
        invalid=len(results) - len(valid),
        finished=sum(r.finished for r in valid),
        scored=sum(r.overall is not None for r in valid),
    )


def _tracks(
    results: Sequence[CellResult], stage_ids: Sequence[str]
) -> tuple[dict[str, TrackAggregate], Callable[..., Mapping[str, list[float | None]]]]:
    """Per track, the means over its valid repeats; and the valid runs' scores by track."""
    by_track: dict[str, list[CellResult]] = {}
    for r in results:
        by_track.setdefault(r.cell.track, []).append(r)

    def runs(score: Callable[[CellResult], float | None]) -> Mapping[str, list[float | None]]:
        return {t: [score(r) for r in rs if r.valid] for t, rs in by_track.items()}

    tracks = {
        t: TrackAggregate(
            overall=_mean([r.overall for r in rs if r.valid]),
            task=_mean([r.task for r in rs if r.valid]),
            stages={s: _mean([r.stages.get(s) for r in rs if r.valid]) for s in stage_ids},
            completion=_counts(rs),
        )
        for t, rs in sorted(by_track.items())
    }
    return tracks, runs


def _tier(results: Sequence[CellResult], stage_ids: Sequence[str]) -> TierAggregate:
    tracks, runs = _tracks(results, stage_ids)
    return TierAggregate(
        overall=mean_of_tracks(runs(lambda r: r.overall)),
        task=mean_of_tracks(runs(lambda r: r.task)),
        agentic=mean_of_tracks(runs(lambda r: r.agentic)),
        stages={s: mean_of_tracks(runs(lambda r, s=s: r.stages.get(s))) for s in stage_ids},
        tracks=tracks,
        completion=_counts(results),
    )


def aggregate(results: Sequence[CellResult], spec: BenchmarkSpec) -> Aggregates:
    """The firewall function: cell results in, only aggregates out.

    Means are over valid cells: within a track over its repeats, then over tracks
    (tracks are the units, as in :func:`bat_gym.rubrics.verifier.scoring.aggregate`). Invalid
    cells count in ``completion.invalid`` and nowhere else. Cells that carry a
    :attr:`~bat_gym.evaluation.cells.CellResult.tier` are also aggregated per tier
    (:class:`TierAggregate`), with the same formula over that tier's cells.
    """
    stage_ids = [s.id for s in spec.stages]
    failures = {c: 0 for c in FAILURE_CATEGORIES}
    for r in results:
        for c in r.failures:
            failures[c] += 1
    tier_names = sorted({r.tier for r in results if r.tier is not None})
    # The headline figures are the tier formula over every cell.
    whole = _tier(results, stage_ids)
    return Aggregates(
        **dict(whole),
        failures=failures,  # type: ignore[arg-type]
        tiers={t: _tier([r for r in results if r.tier == t], stage_ids) for t in tier_names},
        cells_digest=cells_digest(results),
    )
