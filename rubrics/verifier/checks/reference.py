"""Checks that compare the agent's artifacts with the reference run's (out-of-band truth).

The reference run (:mod:`.reference`) is the benchmark's own workflow played by the
verifier on the pristine task. ``matches_reference`` passes only when an artifact is
what that run produced:

* ``mode: file``: the file equals the reference's file (the benchmark's
  :meth:`~bat_gym.benchmark.Benchmark.files_agree`; by default the same bytes);
* ``mode: rows``: a CSV whose every row (keyed by its first column) equals the
  reference CSV's row of the same key, cell by cell: a cell that names a file of the
  workspace must name a file that agrees with the one the reference cell names, a
  number must be within its column's tolerance of the reference's (the benchmark's
  :meth:`~bat_gym.benchmark.Benchmark.numeric_tolerance`, else the check's ``rtol``
  relative and ``atol`` absolute), anything else must be the same text. ``complete`` also asks for every reference key;
  ``at_least`` for a minimum number of rows. A pilot is checked against the reference
  predictions this way (``against``), so its rows must be the model's own outputs;
* ``mode: json``: the values at the dotted ``keys`` of a JSON file equal the
  reference's (numbers within tolerance): facts such as the interpreter and library
  versions or a weights digest, which the agent can only get right by looking.

Null when there is no task oracle or the benchmark declares no reference script. The
tolerances default to exact agreement up to float printing (``rtol`` 1e-9): the shipped
models are deterministic numpy, so anything wider is an attack surface. A tolerance is
never widened to how a value is printed: a cell written with fewer decimals than its
tolerance needs (``0.9`` where the scores agree within 1e-4) fails, and the verdict
says that the printing is too coarse.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import Field

from bat_gym.rubrics.contract.checks import register_check
from bat_gym.rubrics.contract.context import CheckContext, CheckFailed, CheckResult, CheckUnscorable
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reading import listing, read_csv, read_text

__all__ = ["matches_reference", "pipeline_reproduces", "plan_states_facts"]


def _reference(ctx: CheckContext) -> FrozenWorkspace:
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the reference run is unavailable")
    ref = ctx.task.reference
    if ref is None:
        raise CheckUnscorable("the benchmark has no reference run for this task")
    return ref


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return abs(a - b) <= atol + rtol * abs(b)


def _values_agree(mine: Any, ref: Any, rtol: float, atol: float) -> bool:
    if isinstance(ref, bool) or isinstance(mine, bool):
        return mine is ref
    if isinstance(ref, (int, float)) and isinstance(mine, (int, float)):
        return _close(float(mine), float(ref), rtol, atol)
    if isinstance(ref, dict) and isinstance(mine, dict):
        return mine.keys() == ref.keys() and all(
            _values_agree(mine[k], ref[k], rtol, atol) for k in ref
        )
    if isinstance(ref, list) and isinstance(mine, list):
        return len(mine) == len(ref) and all(
            _values_agree(m, r, rtol, atol) for m, r in zip(mine, ref, strict=True)
        )
    if isinstance(ref, str) and isinstance(mine, str):
        # A stated fact may carry more words ("Python 3.11.7 (main, ...)"); the
        # reference value must stand in it as a whole token ("3.11" is not "3.11.7").
        return mine == ref or re.search(rf"(?<![\w.]){re.escape(ref)}(?![\w.])", mine) is not None
    return mine == ref


class _Compare:
    """Cell and file comparison between a workspace and the reference's.

    Numbers agree within their column's tolerance: the benchmark's declared one
    (``tolerance[column]``, else ``tolerance["*"]``), else ``rtol``/``atol``.
    :attr:`coarse` collects the columns whose failing cells were printed too coarsely
    for that tolerance, for the verdict.
    """

    def __init__(
        self,
        ctx: CheckContext,
        ws: FrozenWorkspace,
        ref: FrozenWorkspace,
        rtol: float,
        atol: float,
    ) -> None:
        assert ctx.task is not None
        self.task, self.ws, self.ref = ctx.task, ws, ref
        self.default = (rtol, atol)
        self.declared = dict(getattr(ctx.task, "tolerance", None) or {})
        self.coarse: dict[str, str] = {}

    def tolerance(self, column: str) -> tuple[float, float]:
        """``(rtol, atol)`` of ``column``."""
        tol = self.declared.get(column, self.declared.get("*"))
        return self.default if tol is None else (float(tol[0]), float(tol[1]))

    def files(self, mine: str, theirs: str) -> bool:
        ws = self.ws
        if ws.sha256(mine) is None or self.ref.sha256(theirs) is None:
            return False
        if ws.sha256(mine) == self.ref.sha256(theirs):
            return True
        return bool(self.task.files_agree(mine, ws.read_bytes(mine), self.ref.read_bytes(theirs)))

    def cells(self, column: str, mine: str, theirs: str) -> bool:
        if theirs and self.ref.sha256(posixpath.normpath(theirs)) is not None:
            # The reference cell names a file: the agent's must name one that agrees.
            return self.files(posixpath.normpath(mine), posixpath.normpath(theirs))
        a, b = _number(mine), _number(theirs)
        if a is None or b is None:
            return mine == theirs
        rtol, atol = self.tolerance(column)
        if _close(a, b, rtol, atol):
            return True
        allowed = atol + rtol * abs(b)
        step = _printing_step(mine)
        if step is not None and step / 2 > allowed:
            self.coarse.setdefault(
                column,
                f"{column} printed as {mine!r} (to {step:g}), coarser than its "
                f"tolerance {allowed:.3g} allows",
            )
        return False


def _printing_step(text: str) -> float | None:
    """The unit of the last digit of a plainly printed number (``0.9`` -> 0.1), or None."""
    text = text.strip()
    if not re.fullmatch(r"[+-]?\d+(\.\d*)?", text):
        return None
    decimals = len(text.split(".", 1)[1]) if "." in text else 0
    return 10.0**-decimals


@register_check("matches_reference")
def matches_reference(
    ctx: CheckContext,
    *,
    path: str,
    mode: Literal["file", "rows", "json"] = "file",
    against: str | list[str] | None = None,
    keys: list[str] | None = None,
    complete: bool = False,
    at_least: Annotated[int, Field(ge=0)] = 1,
    rtol: Annotated[float, Field(ge=0, le=1e-3)] = 1e-9,
    atol: Annotated[float, Field(ge=0, le=1e-3)] = 1e-12,
) -> CheckResult:
    """``path`` is what the reference run produced (see the module docstring).

    Args:
        ctx: the episode.
        path: the agent's artifact.
        mode: what agreement means: the whole file, CSV rows, or JSON values.
        against: the reference's file(s) to compare with (default: ``path``); for rows,
            a row agrees when it equals the row of its key in the first file that has
            one (a pilot may be of a case the predictions do not cover).
        keys: dotted JSON keys to compare (``mode: json``); ``a|b.c`` names one fact
            that may be recorded under either key.
        complete: rows: every key of the reference CSV must be present too.
        at_least: rows: the fewest rows that count.
        rtol: relative tolerance on numbers of a column the benchmark declares no
            tolerance for, at most 1e-3.
        atol: absolute tolerance on such numbers, at most 1e-3.
    """
    ref = _reference(ctx)
    evidence = ctx.artifact(path)
    return _agree(
        ctx,
        ctx.workspace,
        ref,
        path,
        ([against] if isinstance(against, str) else against) if against else [path],
        mode,
        keys,
        complete,
        at_least,
        rtol,
        atol,
        evidence,
    )


@register_check("pipeline_reproduces")
def pipeline_reproduces(
    ctx: CheckContext,
    *,
    path: str,
    mode: Literal["file", "rows"] = "rows",
    complete: bool = True,
    rtol: Annotated[float, Field(ge=0, le=1e-3)] = 1e-9,
    atol: Annotated[float, Field(ge=0, le=1e-3)] = 1e-12,
    stage: str | None = None,
) -> CheckResult:
    """The agent's shipped pipeline, run again by the verifier, produces the model's ``path``.

    Reproduce, don't trust: the benchmark's reproduction command runs out of band in a
    fresh sandbox holding the frozen workspace with the task's inputs put back as they
    were and ``path`` removed (:func:`bat_gym.rubrics.verifier.reference.reproduce`); what it
    writes at ``path`` must agree with the reference run's ``path``, as
    ``matches_reference`` compares them. Null when the benchmark declares no
    reproduction command or no reference.

    Args:
        ctx: the episode.
        path: the output the pipeline writes (the predictions).
        mode: compare whole files or CSV rows.
        complete: rows: every reference case must be produced.
        rtol: relative tolerance on numbers, at most 1e-3.
        atol: absolute tolerance on numbers, at most 1e-3.
        stage: the stage whose pipeline is checked. What the benchmark's spec lists as
            a later stage's artifacts (the settings a pilot chooses, say) then start as
            the reference run left them: a Setup is judged by the pipeline it leaves,
            not by choices that are a later stage's to make.
    """
    ref = _reference(ctx)
    assert ctx.task is not None
    again = ctx.task.reproduce(ctx.workspace, (path,), _later_artifacts(ctx, stage))
    if again is None:
        raise CheckUnscorable("the benchmark declares no way to run the pipeline again")
    evidence = _pipeline_evidence(ctx, again) or ctx.artifact(path)
    try:
        result = _agree(
            ctx, again, ref, path, [path], mode, None, complete, 1, rtol, atol, evidence
        )
    except CheckFailed as exc:
        raise CheckFailed(f"the shipped pipeline, run again: {exc.detail}", exc.evidence) from None
    return CheckResult.ok(f"the shipped pipeline, run again: {result.detail}", evidence)


def _pipeline_evidence(ctx: CheckContext, again: FrozenWorkspace) -> tuple:
    """Pointers to the pipeline's files: those the verifier's run read, written ones first.

    The reproduction records what it read (the pipeline is what ran, wherever it lives:
    ``pipeline/infer.py``, ``pipeline/score.py``, a helper module), so the evidence
    names the benchmark's own pipeline files, not a path this check assumes.
    """
    read = sorted(getattr(again, "read", ()) or (), key=lambda p: (not ctx.changed(p), p))
    return tuple(e for p in read[:5] for e in ctx.artifact(p))


def _later_artifacts(ctx: CheckContext, stage: str | None) -> tuple[str, ...]:
    """The artifacts the spec lists for the stages after ``stage`` (none without both)."""
    if stage is None or ctx.spec is None:
        return ()
    ids = [s.id for s in ctx.spec.stages]
    if stage not in ids:
        raise CheckUnscorable(f"{ctx.spec.name} has no stage {stage}")
    return tuple(a for s in ctx.spec.stages[ids.index(stage) + 1 :] for a in s.artifacts)


def _agree(
    ctx: CheckContext,
    ws: FrozenWorkspace,
    ref: FrozenWorkspace,
    path: str,
    against: list[str],
    mode: str,
    keys: list[str] | None,
    complete: bool,
    at_least: int,
    rtol: float,
    atol: float,
    evidence: tuple,
) -> CheckResult:
    """``ws``'s ``path`` against ``ref``'s files ``against`` (see the module docstring)."""
    present = [p for p in against if ref.sha256(p) is not None]
    if not present:
        raise CheckUnscorable(f"the reference run left none of {against}")
    theirs = present[0]
    if ws.sha256(path) is None:
        raise CheckFailed(f"{path} is missing", evidence)
    cmp = _Compare(ctx, ws, ref, rtol, atol)
    if mode == "file":
        if not cmp.files(path, theirs):
            raise CheckFailed(f"{path} is not what the task's pipeline produces", evidence)
        return CheckResult.ok(f"{path} equals the reference run's {theirs}", evidence)
    if mode == "json":
        return _json_agree(ws, ref, path, theirs, keys or [], rtol, atol, evidence)
    header, rows = read_csv(ws, path)
    ref_header, ref_rows = read_csv(ref, theirs)
    if not header or not ref_header or header[0] != ref_header[0]:
        raise CheckFailed(
            f"{path} is not keyed like {theirs} (first column {ref_header[:1]})", evidence
        )
    key = ref_header[0]
    by_key = {r[key]: r for r in ref_rows}
    for other in present[1:]:  # rows of cases the first file does not cover
        _, more = read_csv(ref, other)
        for r in more:
            by_key.setdefault(r.get(key, ""), r)
    if len(rows) < at_least:
        raise CheckFailed(f"{path} has {len(rows)} rows, fewer than {at_least}", evidence)
    wrong = []
    for n, row in enumerate(rows, start=2):
        want = by_key.get(row[key])
        if want is None or any(
            col in want and not cmp.cells(col, row[col], want[col]) for col in header[1:]
        ):
            wrong.append(str(n))
    if wrong:
        coarse = f"; {'; '.join(cmp.coarse.values())}" if cmp.coarse else ""
        raise CheckFailed(
            f"{path}: {len(wrong)} of {len(rows)} rows are not the provided model's outputs "
            f"(lines {listing(wrong)}){coarse}",
            evidence,
        )
    got = {r[key] for r in rows}
    missing = [r[key] for r in ref_rows if r[key] not in got] if complete else []
    if missing:
        raise CheckFailed(f"{path} lacks {len(missing)} of the {len(ref_rows)} cases", evidence)
    return CheckResult.ok(
        f"{path}: all {len(rows)} rows are the provided model's outputs", evidence
    )


def _json_agree(
    ws: FrozenWorkspace,
    ref: FrozenWorkspace,
    path: str,
    theirs: str,
    keys: list[str],
    rtol: float,
    atol: float,
    evidence: tuple,
) -> CheckResult:
    if not keys:
        raise CheckUnscorable("matches_reference with mode json needs keys")
    try:
        mine, want = json.loads(read_text(ws, path)), json.loads(read_text(ref, theirs))
    except (ValueError, RecursionError):
        raise CheckFailed(f"{path} is not valid JSON", evidence) from None
    wrong, compared = [], []
    for dotted in keys:
        # "numpy|packages.numpy": the fact may be recorded under any of these keys.
        options = dotted.split("|")
        b = next((v for v in (_dig(want, o) for o in options) if v is not _MISSING), _MISSING)
        a = next((v for v in (_dig(mine, o) for o in options) if v is not _MISSING), _MISSING)
        if b is _MISSING:  # a fact this benchmark's reference does not record
            continue
        compared.append(dotted)
        if a is _MISSING or not _values_agree(a, b, rtol, atol):
            wrong.append(dotted)
    if not compared:
        raise CheckUnscorable(f"the reference {theirs} records none of {keys}")
    if wrong:
        raise CheckFailed(
            f"{path}: {', '.join(wrong)} differ from what the sandbox really has", evidence
        )
    return CheckResult.ok(f"{path}: {', '.join(compared)} agree with the reference run", evidence)


_MISSING = object()


def _dig(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


@register_check("plan_states_facts")
def plan_states_facts(
    ctx: CheckContext,
    *,
    path: str = "plan/plan.md",
    max_words: Annotated[int, Field(ge=1)] = 400,
) -> CheckResult:
    """The plan states every fact the benchmark declares for this task, right and once.

    :meth:`~bat_gym.benchmark.Benchmark.plan_facts` names what only reading the task
    and the model card reveals (the number of cases, the input convention, the planted
    pitfall). A fact is credited when one of its patterns matches the plan
    (case-insensitive) and none of its rivals does: a plan that also states another
    count of the same thing, another unit or another value of the convention
    contradicts itself, and a blind enumeration of every candidate value states them
    all. A rival's match is excused where it is the value of another fact of the same
    kind (a plan converting mm to cm states two units, both facts). A plan longer than
    ``max_words`` fails whatever it states: the facts are to be stated concisely, so a
    long plan earns no more than a short one. The detail names missing and
    contradicted facts, never their patterns or values. Null when the benchmark
    declares none.

    Args:
        ctx: the episode.
        path: the plan.
        max_words: the longest plan (whitespace-separated words) the stage calls for.
    """
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the task's facts are unavailable")
    facts = ctx.task.plan_facts
    if not facts:
        raise CheckUnscorable("the benchmark declares no plan facts for this task")
    evidence = ctx.artifact(path)
    text = read_text(ctx.workspace, path)
    words = len(text.split())
    if words > max_words:
        raise CheckFailed(
            f"{path} has {words} words, more than the {max_words} a plan of this task "
            "calls for: state each fact once",
            evidence,
        )
    missing = [f.name for f in facts if not _matches(f.patterns, text)]
    contradicted = [
        f.name for f in facts if f.name not in missing and _contradicted(f, facts, text)
    ]
    problems = [f"does not state {'; '.join(missing)}"] if missing else []
    if contradicted:
        problems.append(f"contradicts itself on {'; '.join(contradicted)} (another value too)")
    if problems:
        raise CheckFailed(f"{path} {', and '.join(problems)}", evidence)
    return CheckResult.ok(f"{path} states the task's {len(facts)} facts", evidence)


def _spans(patterns: tuple[str, ...], text: str) -> list[tuple[int, int]]:
    return [m.span() for p in patterns for m in re.finditer(p, text, re.IGNORECASE)]


def _matches(patterns: tuple[str, ...], text: str) -> bool:
    return any(re.search(p, text, re.IGNORECASE) for p in patterns)


def _contradicted(fact: Any, facts: tuple[Any, ...], text: str) -> bool:
    """Whether a rival of ``fact`` matches where no fact of its kind is stated.

    A rival's match overlapping a match of another fact of the same (non-empty) kind
    is that fact's value, not a contradiction.
    """
    kind = getattr(fact, "kind", "")
    siblings = [g for g in facts if kind and g is not fact and getattr(g, "kind", "") == kind]
    excused = [span for g in siblings for span in _spans(g.patterns, text)]
    return any(
        not any(a < e and s < b for s, e in excused)
        for a, b in _spans(tuple(getattr(fact, "rivals", ())), text)
    )
