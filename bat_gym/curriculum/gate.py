"""The promotion gate of the BiCuRL outer loop: promote, hold or flag a candidate.

After an RL round, the candidate checkpoint and the incumbent (the baseline, the last
promoted checkpoint) are evaluated on the same held-out cells. :func:`gate` compares
their :class:`~bat_gym.evaluation.aggregates.Aggregates`, the only evaluation output
training may read, and returns a :class:`GateDecision`.

Every check is a bound on a *drop*, ``drop = baseline - candidate`` (positive: the
candidate is worse). With the reference thresholds (:class:`GateThresholds`):

============== ==================================== =====================
check          value compared                       passes when
============== ==================================== =====================
overall        overall score                        drop <= 0.01
task           task score                           drop <= 0.03
track:<name>   that track's overall score           drop <= 0.05
stage:<id>     guarded stage's score (S3, S4, S5)   drop <= 0.03
catastrophic   overall score                        drop <  0.20
============== ==================================== =====================

The decision is ``catastrophic`` when the catastrophic check fails, ``promote`` when
every check passes, and ``hold`` otherwise. A held candidate is discarded: the next
round starts from the baseline again.

Null scores (missing evidence is null, not zero):

* null in both runs: the check is skipped (it passes, with a note). A stage the
  benchmark does not score, or a guarded stage it does not have, lands here. The
  overall and catastrophic checks are the exception: they fail, since a gate that
  cannot score either run has no grounds to promote.
* null in one run only: the check fails, with a note naming the run. The checks are
  paired; a value without a partner shows neither a drop nor its absence.

Preconditions: both runs have no invalid cell (:attr:`Aggregates.valid`) and the same
:attr:`Aggregates.cells_digest`. Otherwise :func:`gate` raises :class:`GateRefused`
instead of deciding, so no decision is ever built on lost or unpaired cells.

>>> from bat_gym.evaluation.aggregates import Aggregates, CompletionCounts
>>> counts = CompletionCounts(runs=1, valid=1, invalid=0, finished=1, scored=1)
>>> def run(overall: float) -> Aggregates:
...     return Aggregates(overall=overall, task=0.5, agentic=0.5, stages={"S3": 0.5},
...                       tracks={}, completion=counts, failures={}, cells_digest="0" * 64)
>>> gate(run(0.60), run(0.59)).decision
'promote'
>>> gate(run(0.60), run(0.58)).decision
'hold'
>>> gate(run(0.60), run(0.40)).decision
'catastrophic'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from bat_gym.core.errors import BatGymError, ConfigError
from bat_gym.evaluation.aggregates import Aggregates

__all__ = [
    "CheckKind",
    "Decision",
    "GateCheck",
    "GateDecision",
    "GateRefused",
    "GateThresholds",
    "gate",
    "stage_order",
]

Decision = Literal["promote", "hold", "catastrophic"]
CheckKind = Literal["overall", "task", "track", "stage", "catastrophic"]
StageId = Annotated[str, StringConstraints(pattern=r"^S[1-9][0-9]?$")]
Drop = Annotated[float, Field(ge=0.0, le=1.0)]

_STRICT = ConfigDict(extra="forbid", frozen=True)

# Scores are means of floats, so 0.80 - 0.79 comes out as 0.010000000000000009 and
# would fail a 0.01 bound it meets exactly. Rounding drops to 12 places removes that
# representation error (about 1e-16 for scores in [0, 1]) and nothing a gate can see.
_DECIMALS = 12


def stage_order(stage_id: str) -> int:
    """Position of a stage id in the fixed stage order (``"S10"`` after ``"S9"``)."""
    return int(stage_id[1:])


class GateRefused(BatGymError, ValueError):
    """The gate will not compare these two runs.

    Raised when either run lost cells to infrastructure or the runs were evaluated on
    different cells. Re-run the missing cells (or evaluate both checkpoints on the same
    cell set) and gate again.

    Attributes:
        reasons: one line per unmet precondition.
    """

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        listing = "\n".join(f"  - {r}" for r in reasons)
        super().__init__(
            f"the gate refuses to compare these runs ({len(reasons)} problem(s)):\n{listing}"
        )


class GateThresholds(BaseModel):
    """Bounds of the promotion gate; the defaults are the paper's reference values.

    Every ``max_*`` bound passes at equality (a drop of exactly 0.01 meets
    ``max_overall_drop=0.01``); the catastrophic bound triggers at equality.
    """

    model_config = _STRICT

    max_overall_drop: Drop = Field(
        0.01, description="Largest overall-score drop a promoted candidate may show."
    )
    max_task_drop: Drop = Field(
        0.03, description="Largest task-score drop a promoted candidate may show."
    )
    max_track_drop: Drop = Field(0.05, description="Largest drop of any one track's overall score.")
    max_stage_drop: Drop = Field(0.03, description="Largest drop of any guarded stage's score.")
    guarded_stages: tuple[StageId, ...] = Field(
        ("S3", "S4", "S5"),
        description="Stages whose score may not drop by more than max_stage_drop; the "
        "reference guards the late stages, where a regression costs the submission.",
    )
    catastrophic_drop: Drop = Field(
        0.20, description="An overall drop this large or larger is catastrophic forgetting."
    )

    @model_validator(mode="after")
    def _catastrophe_beyond_hold(self) -> GateThresholds:
        # A catastrophic drop must also fail the overall check; otherwise a candidate
        # could be flagged catastrophic while the overall check calls it acceptable.
        if self.catastrophic_drop <= self.max_overall_drop:
            raise ConfigError(
                f"catastrophic_drop ({self.catastrophic_drop}) must be greater than "
                f"max_overall_drop ({self.max_overall_drop})"
            )
        if len(set(self.guarded_stages)) != len(self.guarded_stages):
            raise ConfigError(f"guarded_stages repeats a stage: {self.guarded_stages}")
        return self


class GateCheck(BaseModel):
    """One check of the gate, with the numbers it was decided on."""

    model_config = _STRICT

    name: str = Field(
        description="'overall', 'task', 'track:<name>', 'stage:<id>' or 'catastrophic'."
    )
    kind: CheckKind
    baseline: float | None = Field(description="The incumbent's score (null: unscored).")
    candidate: float | None = Field(description="The candidate's score (null: unscored).")
    drop: float | None = Field(
        description="baseline - candidate; negative is an improvement; null when either "
        "score is null."
    )
    threshold: float = Field(
        description="The bound: passes when drop <= threshold, except 'catastrophic', "
        "which passes when drop < threshold."
    )
    passed: bool
    note: str | None = Field(None, description="Why a null check passed or failed.")


class GateDecision(BaseModel):
    """What the gate decided, every check behind it, and the per-stage changes.

    Holds only aggregate scores and track and stage changes, so it may cross the
    evaluation-to-training firewall (it is what target selection reads).
    """

    model_config = _STRICT

    decision: Decision
    checks: tuple[GateCheck, ...]
    thresholds: GateThresholds
    baseline_stages: dict[StageId, float | None] = Field(
        description="The incumbent's stage scores, in stage order."
    )
    candidate_stages: dict[StageId, float | None] = Field(
        description="The candidate's stage scores, in stage order."
    )
    regressions: dict[StageId, float | None] = Field(
        description="baseline - candidate per stage, in stage order; positive: the "
        "candidate regressed; null when either score is null."
    )
    cells_digest: str = Field(description="The paired cell set both runs were scored on.")

    @property
    def promoted(self) -> bool:
        """True when the candidate becomes the next round's starting checkpoint."""
        return self.decision == "promote"

    @property
    def failed(self) -> tuple[GateCheck, ...]:
        """The checks that did not pass."""
        return tuple(c for c in self.checks if not c.passed)

    def table(self) -> str:
        """A fixed-width table of every check, then the decision."""

        def num(x: float | None) -> str:
            return "null" if x is None else f"{x:.4f}"

        width = max(len("check"), *(len(c.name) for c in self.checks))
        lines = [
            f"{'check':<{width}}  {'baseline':>8}  {'candidate':>9}  {'drop':>8}  "
            f"{'bound':>7}  result"
        ]
        for c in self.checks:
            bound = f"{'<' if c.kind == 'catastrophic' else '<='}{c.threshold:.3f}"
            result = "pass" if c.passed else "FAIL"
            note = f"  ({c.note})" if c.note else ""
            lines.append(
                f"{c.name:<{width}}  {num(c.baseline):>8}  {num(c.candidate):>9}  "
                f"{num(c.drop):>8}  {bound:>7}  {result}{note}"
            )
        lines.append(f"decision: {self.decision}")
        return "\n".join(lines)


def _drop(baseline: float | None, candidate: float | None) -> float | None:
    if baseline is None or candidate is None:
        return None
    return round(baseline - candidate, _DECIMALS)


def _check(
    name: str,
    kind: CheckKind,
    baseline: float | None,
    candidate: float | None,
    threshold: float,
    *,
    required: bool = False,
) -> GateCheck:
    """Decide one check; ``required`` makes null-in-both a failure instead of a skip."""
    drop = _drop(baseline, candidate)
    note: str | None = None
    if drop is not None:
        passed = drop < threshold if kind == "catastrophic" else drop <= threshold
    elif baseline is None and candidate is None:
        passed = not required
        note = "null in both runs: " + (
            "nothing to decide on" if required else "not scored, skipped"
        )
    else:
        passed = False
        missing = "candidate" if candidate is None else "baseline"
        note = f"null in the {missing} only: unpaired, cannot show non-inferiority"
    return GateCheck(
        name=name,
        kind=kind,
        baseline=baseline,
        candidate=candidate,
        drop=drop,
        threshold=threshold,
        passed=passed,
        note=note,
    )


def _refusals(baseline: Aggregates, candidate: Aggregates) -> list[str]:
    reasons = []
    for label, run in (("baseline", baseline), ("candidate", candidate)):
        if not run.valid:
            reasons.append(
                f"the {label} has {run.completion.invalid} invalid cell(s) of "
                f"{run.completion.runs}: re-run them before gating"
            )
    if baseline.cells_digest != candidate.cells_digest:
        reasons.append(
            f"the runs were scored on different cells (cells_digest "
            f"{baseline.cells_digest[:12]}... vs {candidate.cells_digest[:12]}...): "
            "evaluate both checkpoints on the same cells"
        )
    return reasons


def _ordered(ids: Iterable[str]) -> list[str]:
    return sorted(set(ids), key=stage_order)


def _stages(run: Aggregates, ids: list[str]) -> dict[str, float | None]:
    return {s: run.stages.get(s) for s in ids}


def gate(
    baseline: Aggregates,
    candidate: Aggregates,
    thresholds: GateThresholds | None = None,
) -> GateDecision:
    """Decide whether ``candidate`` replaces ``baseline`` (see the module docstring).

    Args:
        baseline: aggregates of the incumbent, the last promoted checkpoint.
        candidate: aggregates of the checkpoint the last round produced, on the same
            cells.
        thresholds: the gate's bounds; default: the reference values.

    Returns:
        The decision, every check in the order overall, task, tracks (by name), guarded
        stages (in stage order), catastrophic, and the per-stage regressions.

    Raises:
        GateRefused: either run has invalid cells, or the two were not scored on the
            same cells.
    """
    thresholds = thresholds or GateThresholds()
    reasons = _refusals(baseline, candidate)
    if reasons:
        raise GateRefused(reasons)

    t = thresholds
    checks = [
        _check(
            "overall",
            "overall",
            baseline.overall,
            candidate.overall,
            t.max_overall_drop,
            required=True,
        ),
        _check("task", "task", baseline.task, candidate.task, t.max_task_drop),
    ]
    for track in sorted(set(baseline.tracks) | set(candidate.tracks)):
        b, c = baseline.tracks.get(track), candidate.tracks.get(track)
        checks.append(
            _check(
                f"track:{track}",
                "track",
                b.overall if b else None,
                c.overall if c else None,
                t.max_track_drop,
            )
        )
    for stage in _ordered(t.guarded_stages):
        checks.append(
            _check(
                f"stage:{stage}",
                "stage",
                baseline.stages.get(stage),
                candidate.stages.get(stage),
                t.max_stage_drop,
            )
        )
    catastrophic = _check(
        "catastrophic",
        "catastrophic",
        baseline.overall,
        candidate.overall,
        t.catastrophic_drop,
        required=True,
    )
    checks.append(catastrophic)

    # A null overall fails the catastrophic check too, but a missing score is not
    # evidence of forgetting: only a measured drop is catastrophic.
    decision: Decision
    if not catastrophic.passed and catastrophic.drop is not None:
        decision = "catastrophic"
    elif all(c.passed for c in checks):
        decision = "promote"
    else:
        decision = "hold"

    ids = _ordered([*baseline.stages, *candidate.stages])
    b_stages, c_stages = _stages(baseline, ids), _stages(candidate, ids)
    return GateDecision(
        decision=decision,
        checks=tuple(checks),
        thresholds=t,
        baseline_stages=b_stages,
        candidate_stages=c_stages,
        regressions={s: _drop(b_stages[s], c_stages[s]) for s in ids},
        cells_digest=baseline.cells_digest,
    )
