"""Earlier stages' files change only through a recorded repair that reproduces; stages link.

A stage row starts from what earlier stages left. What it may change of that is
decided here, by three checks:

* ``unchanged_unless_repaired``: every earlier file keeps its sha256, unless the
  stage's own receipt records the change as a *repair* and the repaired pipeline,
  run by the verifier from the pristine inputs, reproduces the reference outputs.
  Which files are "earlier" is not only the contract's list: the pipeline's file set
  is what the pipeline actually read (:class:`~bat_gym.rubrics.verifier.reference.Reproduction`),
  in the verifier's reproduction of the start and of the final workspace, and in the
  episode's own runs of the pipeline. A module that shadows an import, wherever it
  lives, or a settings file an earlier stage wrote and the pipeline reads, is
  pipeline: frozen, or repaired in the open.
* ``upstream_repaired``: where the start state carries an earlier stage's defect (its
  pipeline does not reproduce the reference outputs, or its outputs are not the
  reference's), the stage earns this item only with a repair recorded in its receipt;
  null where the start state is clean.
* ``stages_linked``: a stage's artifact is the earlier stage's artifact it consumes,
  mapped through its columns (S5's submission is the predictions that passed S4), and
  where that earlier artifact changed, it is what the repaired pipeline reproduces.

The repair record lives in the stage's receipt (``validation/s4_completion.json``)::

    "repairs": [{"path": "pipeline/infer.py", "sha256_before": "<hex or null if new>",
                 "sha256_after": "<hex or null if deleted>", "reason": "one line"}]

An entry must record exactly the change: ``sha256_before`` the start state's sha256 of
``path``, ``sha256_after`` the final one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bat_gym.rubrics.contract.checks import register_check
from bat_gym.rubrics.contract.context import (
    CheckContext,
    CheckFailed,
    CheckResult,
    CheckUnscorable,
    Evidence,
)
from bat_gym.rubrics.contract.workspace import FrozenWorkspace, path_matches
from bat_gym.rubrics.verifier.checks.reference import matches_reference, pipeline_reproduces
from bat_gym.rubrics.verifier.provenance import observed_run_of
from bat_gym.rubrics.verifier.reading import listing, read_csv

__all__ = [
    "Repair",
    "REPAIRS_KEY",
    "recorded_repairs",
    "unchanged_unless_repaired",
    "upstream_repaired",
    "stages_linked",
]

REPAIRS_KEY = "repairs"
"""The key of a stage receipt that lists the stage's repairs of earlier artifacts."""

_SHA256 = r"^[0-9a-f]{64}$"


class Repair(BaseModel):
    """One recorded repair: a change of one workspace file, and why."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    path: str = Field(min_length=1, description="Workspace-relative file path.")
    sha256_before: str | None = Field(
        pattern=_SHA256, description="The start state's sha256; null if the file is new."
    )
    sha256_after: str | None = Field(
        pattern=_SHA256, description="The final sha256; null if the file was deleted."
    )
    reason: str = Field(min_length=1, description="What was wrong, and the evidence.")


def recorded_repairs(ws: FrozenWorkspace, receipt: str) -> list[Repair]:
    """The repairs ``receipt`` records; none when it is missing or records none.

    Raises:
        CheckFailed: the receipt has a ``repairs`` key that is not a list of repairs.
    """
    if ws.sha256(receipt) is None:
        return []
    try:
        body = json.loads(ws.read_text(receipt))
    except (ValueError, RecursionError):
        return []  # a receipt that is not JSON is the receipt check's business
    if not isinstance(body, dict) or REPAIRS_KEY not in body:
        return []
    entries = body[REPAIRS_KEY]
    try:
        if not isinstance(entries, list):
            raise TypeError
        return [Repair.model_validate(e) for e in entries]
    except (TypeError, ValidationError):
        raise CheckFailed(
            f"{receipt}: {REPAIRS_KEY} must be a list of "
            "{path, sha256_before, sha256_after, reason} (sha256 in hex, null for absent)",
            (Evidence.artifact(receipt, ws.sha256(receipt) or ""),),
        ) from None


def _misrecorded(ctx: CheckContext, repairs: list[Repair]) -> list[str]:
    """Descriptions of the entries that do not record exactly the file's change."""
    wrong = []
    for r in repairs:
        before, after = ctx.start.sha256(r.path), ctx.workspace.sha256(r.path)
        if (r.sha256_before, r.sha256_after) != (before, after):
            wrong.append(
                f"{r.path} (recorded {_short(r.sha256_before)} -> {_short(r.sha256_after)}, is {_short(before)} -> {_short(after)})"
            )
        elif before == after:
            wrong.append(f"{r.path} (recorded, but unchanged)")
    return wrong


def _short(sha: str | None) -> str:
    return "absent" if sha is None else sha[:12]


def _pipeline_files(ctx: CheckContext, output: str, entry: str) -> set[str]:
    """Every workspace file the pipeline reads: in the reproductions and the episode.

    The verifier's reproductions of the start and the final workspace give what the
    pipeline read there (:attr:`~bat_gym.rubrics.verifier.reference.Reproduction.read`); the
    episode's observed runs of ``entry`` add the start files their calls read, so a
    file read in the episode and not in the reproduction is still accounted for.
    """
    files: set[str] = set()
    if ctx.task is not None:
        for ws in (ctx.start, ctx.workspace):
            again = ctx.task.reproduce(ws, (output,))
            files.update(getattr(again, "read", ()) or ())
    root = ctx.record.workspace_root
    for call in ctx.record.calls:
        if call.runs is not None and call.reads and observed_run_of(call, entry, root):
            files.update(p for p in call.reads if ctx.start.sha256(p) is not None)
    return {p for p in files if "__pycache__" not in p.split("/")}


def _own_artifacts(ctx: CheckContext, stage: str | None, receipt: str) -> set[str]:
    own = {receipt}
    if stage is not None and ctx.spec is not None:
        own.update(a for s in ctx.spec.stages if s.id == stage for a in s.artifacts)
    return own


@register_check("unchanged_unless_repaired")
def unchanged_unless_repaired(
    ctx: CheckContext,
    *,
    paths: Annotated[list[str], Field(min_length=1)],
    receipt: str,
    stage: str | None = None,
    reproduces: str | None = None,
    entry: str = "pipeline/infer.py",
) -> CheckResult:
    """Earlier files change only through a recorded, attributed repair that reproduces.

    The frozen set is every start or final file at or under ``paths``, plus, with
    ``reproduces`` (the output the pipeline writes), the pipeline's file set: every
    file the pipeline read, new or old, in the verifier's reproductions and in the
    episode's observed runs of ``entry``. The stage's own artifacts (``stage``'s in
    the benchmark's spec, and ``receipt``) are not frozen. Each frozen file keeps its
    sha256, or ``receipt``'s ``repairs`` record exactly its change; every recorded
    entry must be exact (its start and final sha256). Where anything was repaired,
    the repaired pipeline, run again by the verifier on the pristine inputs, must
    reproduce the reference's ``reproduces`` (as ``pipeline_reproduces``).

    Null when nothing is frozen (the start state lacks what the contract expects), or
    a repair cannot be reproduced for want of a task oracle.
    """
    # Start files under the listed paths, and files new there (a module added to the
    # frozen pipeline folder); compiled caches are Python's, not the agent's.
    frozen = {
        p
        for p in {*ctx.start.paths(), *ctx.workspace.paths()}
        if any(path_matches(p, pattern) for pattern in paths) and "__pycache__" not in p.split("/")
    }
    if reproduces is not None:
        frozen |= _pipeline_files(ctx, reproduces, entry)
    frozen -= _own_artifacts(ctx, stage, receipt)
    repairs = recorded_repairs(ctx.workspace, receipt)
    if not frozen and not repairs:
        raise CheckUnscorable(f"the start workspace has no files under {paths}")
    evidence = ctx.artifact(receipt)
    wrong = _misrecorded(ctx, repairs)
    if wrong:
        raise CheckFailed(
            f"{receipt} records repairs that are not the changes made: {'; '.join(wrong)}", evidence
        )
    recorded = {r.path for r in repairs}
    changed = sorted(p for p in frozen if ctx.start.sha256(p) != ctx.workspace.sha256(p))
    unrecorded = [p for p in changed if p not in recorded]
    if unrecorded:
        raise CheckFailed(
            f"earlier files changed without a repair recorded in {receipt}: {listing(unrecorded)}",
            evidence,
        )
    if not repairs:
        kept = tuple(
            Evidence.artifact(p, sha) for p in sorted(frozen) if (sha := ctx.start.sha256(p))
        )
        return CheckResult.ok(f"{len(frozen)} earlier files unchanged", kept)
    if reproduces is not None:
        if ctx.task is None:
            raise CheckUnscorable("no task oracle: a recorded repair cannot be reproduced")
        try:
            pipeline_reproduces(ctx, path=reproduces)
        except CheckFailed as exc:
            raise CheckFailed(
                f"the recorded repair does not reproduce: {exc.detail}", evidence
            ) from None
    return CheckResult.ok(
        f"{len(frozen)} earlier files unchanged but {listing(sorted(recorded))}, "
        f"repaired as {receipt} records" + (" and reproduced" if reproduces else ""),
        evidence,
    )


@register_check("upstream_repaired")
def upstream_repaired(
    ctx: CheckContext,
    *,
    reproduces: str,
    receipt: str,
    earlier_outputs: list[str] | None = None,
) -> CheckResult:
    """Where the start state carries an earlier stage's defect, the stage records a repair.

    The defect is what the verifier can tell: the start state's pipeline, run again on
    the pristine inputs, does not reproduce the reference's ``reproduces``, or one of
    ``earlier_outputs`` in the start state has rows that are not the reference run's
    (against the same path or ``reproduces``). Then ``receipt`` must record at least
    one exact repair (``unchanged_unless_repaired`` asks that it reproduces). Null
    where the start state is clean, or without a task oracle or reference.
    """
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the start state cannot be judged")
    at_start = dataclasses.replace(ctx, workspace=ctx.start)
    defects = []
    try:
        pipeline_reproduces(at_start, path=reproduces)
    except CheckFailed:
        defects.append("its pipeline does not reproduce the reference outputs")
    for path in earlier_outputs or ():
        if ctx.start.sha256(path) is None:
            continue
        try:
            matches_reference(at_start, path=path, mode="rows", against=[path, reproduces])
        except CheckFailed:
            defects.append(f"its {path} is not the reference run's")
    if not defects:
        raise CheckUnscorable("the start state carries no earlier defect: nothing to repair")
    said = "the start state carries an earlier stage's defect (" + "; ".join(defects) + ")"
    repairs = recorded_repairs(ctx.workspace, receipt)
    evidence = ctx.artifact(receipt)
    exact = [r for r in repairs if not _misrecorded(ctx, [r])]
    if not exact:
        raise CheckFailed(f"{said}, and {receipt} records no repair", evidence)
    return CheckResult.ok(
        f"{said}; {receipt} records its repair of {listing([r.path for r in exact])}", evidence
    )


@register_check("stages_linked")
def stages_linked(
    ctx: CheckContext,
    *,
    path: str,
    source: str,
    reproduces: str | None = None,
) -> CheckResult:
    """``path`` is the earlier stage's ``source``, mapped through ``path``'s columns.

    Every row of ``path`` (keyed by its first column) is the row of ``source`` with
    the same key, cell for cell on ``path``'s columns: the same text, the same number,
    or a file that agrees (by the benchmark's ``files_agree``). Where ``source``
    changed since the start (a repair), it must also be, row for row, what the
    pipeline run again by the verifier writes at ``reproduces``: an artifact computed
    afresh, or a copy of the fix deleted afterwards, links to nothing.
    """
    header, rows = read_csv(ctx.workspace, path)
    evidence = ctx.artifact(path) + ctx.artifact(source)
    if ctx.workspace.sha256(source) is None:
        raise CheckFailed(f"{source}, which {path} must be made from, is missing", evidence)
    mismatch = _unlinked(ctx, ctx.workspace, header, rows, source)
    if mismatch:
        raise CheckFailed(f"{path} is not {source}: {mismatch}", evidence)
    if reproduces is not None and ctx.start.sha256(source) not in (
        None,
        ctx.workspace.sha256(source),
    ):
        if ctx.task is None:
            raise CheckUnscorable(f"no task oracle: the changed {source} cannot be reproduced")
        again = ctx.task.reproduce(ctx.workspace, (reproduces,))
        if again is None:
            raise CheckUnscorable("the benchmark declares no way to run the pipeline again")
        mine_header, mine = read_csv(ctx.workspace, source)
        mismatch = _unlinked(ctx, again, mine_header, mine, reproduces)
        if mismatch:
            raise CheckFailed(
                f"{source} changed and is not what the pipeline writes: {mismatch}", evidence
            )
    return CheckResult.ok(f"every row of {path} is {source}'s", evidence)


def _unlinked(
    ctx: CheckContext,
    other: FrozenWorkspace,
    header: list[str],
    rows: list[dict[str, str]],
    source: str,
) -> str:
    """Why ``rows`` (of the workspace) are not ``other``'s ``source`` rows; "" if they are."""
    if not header:
        return "no columns"
    try:
        src_header, src_rows = read_csv(other, source)
    except CheckFailed as exc:
        return exc.detail
    missing = [c for c in header if c not in src_header]
    if missing:
        return f"{source} has no column {listing(missing)}"
    key = header[0]
    by_key = {r[key]: r for r in src_rows}
    wrong = [
        str(n)
        for n, row in enumerate(rows, start=2)
        if row[key] not in by_key
        or not all(_cells_agree(ctx, other, row[c], by_key[row[key]][c]) for c in header[1:])
    ]
    if wrong:
        return f"{len(wrong)} of {len(rows)} rows differ (lines {listing(wrong)})"
    return ""


def _cells_agree(ctx: CheckContext, other: FrozenWorkspace, mine: str, theirs: str) -> bool:
    if mine == theirs:
        return True
    a, b = _number(mine), _number(theirs)
    if a is not None and b is not None:
        return a == b  # the same value, printed otherwise: no tolerance, it is a copy
    mine_file, their_file = posixpath.normpath(mine), posixpath.normpath(theirs)
    mine_sha, their_sha = ctx.workspace.sha256(mine_file), other.sha256(their_file)
    if mine_sha is None or their_sha is None:
        return False
    if mine_sha == their_sha:
        return True
    return ctx.task is not None and bool(
        ctx.task.files_agree(
            mine_file, ctx.workspace.read_bytes(mine_file), other.read_bytes(their_file)
        )
    )


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
