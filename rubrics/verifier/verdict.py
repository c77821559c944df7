"""The verifier: a contract applied to a frozen episode, giving a :class:`Verdict`.

For a stage contract, every item's check runs on the :class:`CheckContext`; the stage
score is the weighted mean of the binary credit items (or the highest level reached),
with null items excluded, and 0 if a guard item failed; the credit is that score times
the evidence completeness η; the gates may cap the reward at 0. For an E2E contract, each composed stage contract is scored the
same way (stage-row-only items skipped) and

    reward = tw * task + (1 - tw) * sum_s w_s * credit_s / sum_s w_s

with the spec's stage weights ``w_s`` and task weight ``tw`` (see :mod:`.scoring`).

Only the frozen workspaces and the execution record are evidence. The agent's messages
are not in the context at all, so a claim of success earns nothing by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.core.errors import SandboxError, WorkspaceRejected
from bat_gym.core.record import ExecutionRecord
from bat_gym.core.spec import E2E, ContractRef
from bat_gym.rubrics.contract.checks import error_line, run_check
from bat_gym.rubrics.contract.context import CheckContext, Evidence, EvidenceKind
from bat_gym.rubrics.contract.model import ContractLibrary, GateName, RubricContract
from bat_gym.rubrics.verifier.scoring import agentic_score, e2e_reward, level_score, stage_score

__all__ = [
    "RejectionCategory",
    "rejected_verdict",
    "ItemVerdict",
    "StageVerdict",
    "GateVerdict",
    "Verdict",
    "evidence_completeness",
    "verify",
]

log = logging.getLogger(__name__)

_STRICT = ConfigDict(extra="forbid", frozen=True)
_UNIT = {"ge": 0.0, "le": 1.0}


RejectionCategory = Literal["unsafe_workspace", "quota_exceeded"]
"""Why a workspace was refused (:attr:`bat_gym.core.errors.WorkspaceRejected.category`)."""


class ItemVerdict(BaseModel):
    """One checklist item's decision and what it rests on."""

    model_config = _STRICT

    id: str
    check: str
    weight: float = Field(ge=0)
    guard: bool = Field(description="A precondition: no credit, but failing it zeroes the stage.")
    requires: tuple[EvidenceKind, ...] = Field(description="Evidence kinds a pass must rest on.")
    passed: bool | None = Field(description="None: null (infrastructure), excluded from the score.")
    evidence: tuple[Evidence, ...]
    evidence_complete: bool = Field(description="Every required evidence kind is present.")
    detail: str


class StageVerdict(BaseModel):
    """One stage contract applied: items, score, η and credit."""

    model_config = _STRICT

    stage: str = Field(description="The stage id, e.g. S3.")
    contract: ContractRef
    items: tuple[ItemVerdict, ...]
    skipped: tuple[str, ...] = Field(
        (), description="Stage-row-only items left out because an E2E contract composed this one."
    )
    null_items: tuple[str, ...] = Field(description="Items that could not be scored.")
    score: float | None = Field(description="Mean of items or level reached; None: null.", **_UNIT)
    eta: float = Field(description="Evidence completeness of the passed items.", **_UNIT)
    credit: float | None = Field(description="score * eta; None: null.", **_UNIT)


class GateVerdict(BaseModel):
    """Whether a gate let credit through, and why."""

    model_config = _STRICT

    gate: GateName
    passed: bool
    reason: str


class Verdict(BaseModel):
    """The verifier's decision on one finished episode."""

    model_config = _STRICT

    contract: ContractRef = Field(description="The contract applied, with its digest.")
    focus: str = Field(description="S1..S9 or E2E.")
    stages: tuple[StageVerdict, ...] = Field(description="One per stage scored.")
    stage_score: float | None = Field(
        description="Stage row: the stage's credit; E2E: the weighted mean of stage credits.",
        **_UNIT,
    )
    task_score: float | None = Field(
        None,
        description="E2E: the benchmark's task metric; None otherwise or if unscorable.",
        **_UNIT,
    )
    eta: float = Field(description="Evidence completeness over every passed item.", **_UNIT)
    gates: tuple[GateVerdict, ...]
    reward: float | None = Field(
        description="The episode's reward; None: null (drop the rollout, do not score it 0).",
        **_UNIT,
    )
    notes: tuple[str, ...] = Field((), description="Nulls, gates applied, anything excluded.")
    rejected: RejectionCategory | None = Field(
        None,
        description=(
            "Set when the workspace could not be taken as the agent left it: every stage "
            "scores 0 and so does the reward (see :func:`rejected_verdict`)."
        ),
    )

    def summary(self) -> str:
        """One line: reward, each stage's credit, task score, η, closed gates, contract.

        What ``print(verdict)`` shows (``repr`` keeps the full model), e.g.
        ``E2E reward 0.950: stage credit S1 1.00, S2 0.90; task score 1.000; evidence
        completeness 1.00; contract toy 2.0 (sha256 0123456789ab)``.
        """
        credit = ", ".join(f"{s.stage} {_num(s.credit, 2)}" for s in self.stages)
        parts = [f"stage credit {credit or 'none'}"]
        if self.task_score is not None:
            parts.append(f"task score {self.task_score:.3f}")
        parts.append(f"evidence completeness {self.eta:.2f}")
        closed = [g.gate for g in self.gates if not g.passed]
        if closed:
            parts.append(f"gate {', '.join(closed)} closed")
        if self.rejected:
            parts.append(f"workspace rejected ({self.rejected})")
        ref = self.contract
        parts.append(f"contract {ref.id} {ref.version} (sha256 {ref.sha256[:12]})")
        return f"{self.focus} reward {_num(self.reward, 3)}: " + "; ".join(parts)

    def explain(self) -> str:
        """Several lines: the summary, then each stage's items, the gates and the notes.

        One line per item: ``pass``/``FAIL``/``null``, its id and check, ``guard`` or its
        weight, ``evidence incomplete`` where a pass lacks a required evidence kind
        (η discounts it), and the check's detail.
        """
        lines = [self.summary()]
        for s in self.stages:
            lines.append(
                f"{s.stage} ({s.contract.id}): credit {_num(s.credit, 2)} = "
                f"score {_num(s.score, 2)} x evidence completeness {s.eta:.2f}"
            )
            for i in s.items:
                mark = "null" if i.passed is None else "pass" if i.passed else "FAIL"
                role = "guard" if i.guard else f"weight {i.weight:g}"
                short = "; evidence incomplete" if i.passed and not i.evidence_complete else ""
                lines.append(f"  {mark} {i.id} [{i.check}, {role}{short}] {i.detail}".rstrip())
            if s.skipped:
                lines.append(f"  skipped (stage row only): {', '.join(s.skipped)}")
        lines += [
            f"gate {g.gate}: {'open' if g.passed else 'closed'}, {g.reason}" for g in self.gates
        ]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _num(value: float | None, digits: int) -> str:
    """``value`` to ``digits`` decimals, or ``null`` (unscored)."""
    return "null" if value is None else f"{value:.{digits}f}"


def evidence_completeness(items: Sequence[ItemVerdict]) -> float:
    """η: the share of passed items whose required evidence kinds are all present.

    ``eta = |{i passed : requires_i ⊆ kinds(evidence_i)}| / |{i passed}|``; 1 when no
    item passed (nothing is claimed, so nothing is discounted).
    """
    passed = [i for i in items if i.passed]
    if not passed:
        return 1.0
    return sum(i.evidence_complete for i in passed) / len(passed)


def _successful_change(record: ExecutionRecord) -> GateVerdict:
    hits = [c.index for c in record.calls if c.succeeded and c.changed_workspace]
    if hits:
        reason = f"call #{hits[0]} exited 0 and changed the workspace"
    elif not record.calls:
        reason = "no tool call was made"
    else:
        reason = (
            f"none of the {len(record.calls)} tool calls both exited 0 and changed the workspace"
        )
    return GateVerdict(gate="successful_change", passed=bool(hits), reason=reason)


_GATES: dict[str, Callable[[ExecutionRecord], GateVerdict]] = {
    "successful_change": _successful_change,
}


def _score_stage(contract: RubricContract, ctx: CheckContext, *, composed: bool) -> StageVerdict:
    """Run a stage contract's items and aggregate them (see the module docstring)."""
    skipped = tuple(i.id for i in contract.items if composed and i.scope == "stage")
    verdicts = []
    for item in contract.items:
        if item.id in skipped:
            continue
        result = run_check(item.check, ctx, item.args)
        verdicts.append(
            ItemVerdict(
                id=item.id,
                check=item.check,
                weight=item.weight,
                guard=item.guard,
                requires=item.requires,
                passed=result.passed,
                evidence=result.evidence,
                evidence_complete=set(item.requires) <= result.kinds,
                detail=result.detail,
            )
        )
    credit = [v for v in verdicts if not v.guard]
    if contract.aggregation == "levels":
        levels = [
            (lv.score, [i for i in lv.requires if i not in skipped]) for lv in contract.levels
        ]
        score = level_score(levels, {v.id: v.passed for v in credit})
    else:
        score = stage_score([v.passed for v in credit], [v.weight for v in credit])
    if any(v.guard and v.passed is False for v in verdicts):
        score = 0.0
    eta = evidence_completeness(verdicts)
    return StageVerdict(
        stage=contract.focus,
        contract=contract.ref,
        items=tuple(verdicts),
        skipped=skipped,
        null_items=tuple(v.id for v in verdicts if v.passed is None),
        score=score,
        eta=eta,
        credit=None if score is None else score * eta,
    )


def _task_score(ctx: CheckContext, notes: list[str]) -> float | None:
    """The benchmark's task metric, or None with a note saying why it is missing."""
    if ctx.task is None:
        notes.append("no task oracle: the task score is null")
        return None
    try:
        task = ctx.task.score(ctx.workspace)
    except SandboxError as exc:  # a missing or corrupted blob is no fault of the agent
        notes.append(f"infrastructure fault while computing the task score: {exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - agent files can make any reader raise
        log.warning("the task metric raised on this workspace", exc_info=True)
        notes.append(
            f"the task metric could not read the submission, so it scores 0: {error_line(exc)}"
        )
        return 0.0
    if task is None:
        notes.append("the benchmark could not score the task")
    return task


def rejected_verdict(
    contract: RubricContract,
    rejection: WorkspaceRejected,
    *,
    library: ContractLibrary | None = None,
) -> Verdict:
    """The verdict of an episode whose workspace the host refused to take.

    Agent code caused it (an escaping link, a name no manifest can hold, a workspace
    past its quota), so it is a scored zero, not an infrastructure failure: every stage
    the contract covers gets score and credit 0, the task (for an E2E contract that
    scores one) 0, the reward 0, and :attr:`Verdict.rejected` names the category.
    """
    if contract.focus == E2E:
        library = library or ContractLibrary.reference()
        components = [library.component(c) for c in contract.components]
    else:
        components = [contract]
    stages = tuple(
        StageVerdict(
            stage=c.focus,
            contract=c.ref,
            items=(),
            null_items=(),
            score=0.0,
            eta=1.0,
            credit=0.0,
        )
        for c in components
    )
    category: RejectionCategory = (
        "quota_exceeded" if rejection.category == "quota_exceeded" else "unsafe_workspace"
    )
    return Verdict(
        contract=contract.ref,
        focus=contract.focus,
        stages=stages,
        stage_score=0.0,
        task_score=0.0 if contract.focus == E2E and contract.task_score else None,
        eta=1.0,
        gates=(),
        reward=0.0,
        notes=(f"{category}: {rejection}",),
        rejected=category,
    )


def verify(
    contract: RubricContract, ctx: CheckContext, *, library: ContractLibrary | None = None
) -> Verdict:
    """Score one finished episode against ``contract``.

    Args:
        contract: a stage or E2E contract.
        ctx: the frozen workspaces, execution record and task oracle of the episode.
        library: where an E2E contract's components are looked up (default: the
            reference library).

    Returns:
        The verdict; its ``reward`` is None when the episode could not be scored.

    Raises:
        ValueError: an E2E contract without ``ctx.spec`` (its weights come from there).
        RubricContractError: an E2E component is missing from ``library``.
    """
    notes: list[str] = []
    task: float | None = None
    if contract.focus == E2E:
        if ctx.spec is None:
            raise ValueError(
                "an E2E verdict needs ctx.spec: stage weights and task weight come from it"
            )
        library = library or ContractLibrary.reference()
        stages = tuple(
            _score_stage(library.component(c), ctx, composed=True) for c in contract.components
        )
        credits = {s.stage: s.credit for s in stages}
        stage_part = agentic_score(credits, ctx.spec)
        if contract.task_score:
            task = _task_score(ctx, notes)
            reward = e2e_reward(credits, task, ctx.spec)
        else:
            reward = stage_part
    else:
        stages = (_score_stage(contract, ctx, composed=False),)
        stage_part = reward = stages[0].credit
    for s in stages:
        broken = [i.id for i in s.items if i.guard and i.passed is False]
        if broken:
            notes.append(f"{s.stage}: guard {', '.join(broken)} failed, so the stage scores 0")
        if s.score is None:
            notes.append(f"{s.stage}: every item is null, so the stage is unscored")
        elif s.null_items:
            notes.append(
                f"{s.stage}: null items excluded from the score: {', '.join(s.null_items)}"
            )
    gates = tuple(_GATES[g](ctx.record) for g in contract.gates)
    closed = [g.gate for g in gates if not g.passed]
    if closed and reward is not None:
        reward = 0.0
        notes.append(f"gate {', '.join(closed)} capped the reward at 0")
    return Verdict(
        contract=contract.ref,
        focus=contract.focus,
        stages=stages,
        stage_score=stage_part,
        task_score=task,
        eta=evidence_completeness([i for s in stages for i in s.items]),
        gates=gates,
        reward=reward,
        notes=tuple(notes),
    )
