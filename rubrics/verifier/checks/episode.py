"""Checks on what happened during the episode: tool calls, changes since the start, the task.

``command_ran``, ``pipeline_ran``, ``written_by_tool`` and ``stage_artifacts_written``
read the execution record, ``unchanged`` compares the frozen workspace with the start
snapshot, and ``task_metric_at_least``, ``pilot_quality``, ``pilot_checked`` and
``matches_answers`` consult the task oracle (private answers and metrics) that only the verifier holds.
Each is registered under its function's name.
"""

from __future__ import annotations

import math
import posixpath
from typing import Annotated, Literal, NoReturn

from pydantic import Field

from bat_gym.core.record import ToolCallRecord
from bat_gym.rubrics.contract.checks import register_check
from bat_gym.rubrics.contract.context import (
    CheckContext,
    CheckFailed,
    CheckResult,
    CheckUnscorable,
    Evidence,
)
from bat_gym.rubrics.contract.workspace import FrozenWorkspace, path_matches
from bat_gym.rubrics.verifier.invocation import runs_script
from bat_gym.rubrics.verifier.provenance import observed_run_of
from bat_gym.rubrics.verifier.reading import listing, read_csv, read_json, states_answer

__all__ = [
    "command_ran",
    "pipeline_ran",
    "written_by_tool",
    "stage_artifacts_written",
    "unchanged",
    "task_metric_at_least",
    "pilot_quality",
    "pilot_checked",
    "matches_answers",
]


@register_check("command_ran")
def command_ran(
    ctx: CheckContext,
    *,
    mentions: Annotated[list[str], Field(min_length=1)],
    changed_workspace: bool = False,
    language: Literal["python", "bash"] | None = None,
) -> CheckResult:
    """A tool call whose code contains every string in ``mentions`` exited 0.

    With ``changed_workspace``, that call must also have changed the workspace. Null
    when no matching call succeeded but one was cut short by a sandbox restart.
    """
    matching = [
        c
        for c in ctx.record.calls
        if all(m in c.code for m in mentions) and (language is None or c.language == language)
    ]
    good = [c for c in matching if c.succeeded and (c.changed_workspace or not changed_workspace)]
    what = f"a call mentioning {mentions}"
    if good:
        call = good[-1]
        return CheckResult.ok(
            f"call #{call.index} ({what}) exited 0", (Evidence.execution(call.index),)
        )
    _explain_no_success(matching, what, what)


@register_check("pipeline_ran")
def pipeline_ran(
    ctx: CheckContext,
    *,
    entry: str,
    writes: Annotated[list[str], Field(min_length=1)],
) -> CheckResult:
    """One call ran the script ``entry``, exited 0, and wrote each file of ``writes``.

    Where the sandbox observed the call (``runs`` recorded), "ran" is what it saw
    (:mod:`bat_gym.rubrics.verifier.provenance`): a program run naming the script that exited
    0, and "wrote" is the call's recorded writes. A call that only names the script,
    or runs it and writes the files in another call, does not count. Without an
    observation (records made by a backend that cannot observe execution), "runs" is
    read from the call's code (:mod:`bat_gym.rubrics.verifier.invocation`) and "wrote" means
    the call changed the workspace and names each file.

    Each file of ``writes`` must also be new or different since the start. Null when
    no such call succeeded but one was cut short by a sandbox restart.
    """
    root = ctx.record.workspace_root
    what = f"call running {entry} that wrote {listing(writes)}"
    matching: list[ToolCallRecord] = []
    good: list[tuple[ToolCallRecord, str]] = []
    why_not = ""  # the latest observed near miss, in words
    for c in ctx.record.calls:
        if c.runs is not None and c.writes is not None:
            how = observed_run_of(c, entry, root)
            if how is None:
                if c.succeeded and runs_script(c.code, c.language, entry):
                    why_not = f"call #{c.index} names {entry}, but the sandbox saw no run of it that exited 0"
                continue
            missing = [p for p in writes if p not in c.writes]
            if c.succeeded and not missing:
                good.append((c, how))
            elif c.succeeded:
                why_not = f"call #{c.index} {how} but did not write {listing(missing)}"
            matching.append(c)
            continue
        names = [(p, p.rsplit("/", 1)[-1]) for p in writes]
        # The cheap test first: parsing code is the costly part.
        if all(path in c.code or name in c.code for path, name in names) and runs_script(
            c.code, c.language, entry
        ):
            matching.append(c)
            if c.succeeded and c.changed_workspace:
                good.append((c, "its code runs it (no observation recorded)"))
    if good:
        call, how = good[-1]
        unchanged_files = [p for p in writes if not ctx.changed(p)]
        if unchanged_files:
            raise CheckFailed(
                f"a {what} exited 0, but {listing(unchanged_files)} was not written in this episode",
                (Evidence.execution(call.index),),
            )
        evidence = (Evidence.execution(call.index),) + tuple(
            e for p in writes for e in ctx.artifact(p) if e.kind == "artifact"
        )
        return CheckResult.ok(f"call #{call.index} {how} and wrote {listing(writes)}", evidence)
    if why_not and not any(c.restarted for c in matching):
        raise CheckFailed(f"no {what}: {why_not}")
    _explain_no_success(matching, f"a {what}", what)


@register_check("written_by_tool")
def written_by_tool(
    ctx: CheckContext, *, paths: Annotated[list[str], Field(min_length=1)]
) -> CheckResult:
    """Each path is a file that was absent or different in the start workspace.

    Only tool calls write the workspace during an episode, so a file that changed was
    written by one; the evidence names the call credited (see ``CheckContext.writer``).
    """
    evidence: tuple[Evidence, ...] = ()
    for path in paths:
        if not ctx.workspace.exists(path):
            raise CheckFailed(f"{path} is missing", evidence)
        if not ctx.changed(path):
            raise CheckFailed(f"{path} is unchanged since the start; no call wrote it", evidence)
        evidence += ctx.artifact(path)
    if not ctx.record.any_change:
        raise CheckUnscorable(
            "files changed but the record shows no call that changed the workspace"
        )
    return CheckResult.ok(f"written during the episode: {listing(paths)}", evidence)


@register_check("stage_artifacts_written")
def stage_artifacts_written(ctx: CheckContext, *, stage: str) -> CheckResult:
    """Every artifact the benchmark's spec lists for ``stage`` was written in the episode.

    The list comes from the benchmark (``Stage.artifacts`` of its spec), not from the
    workspace, so one contract asks each benchmark for what its own stage produces.
    Null without a spec, or when the spec lists no artifacts for ``stage``.
    """
    if ctx.spec is None:
        raise CheckUnscorable("no benchmark spec: the stage's artifacts are unknown")
    found = [s for s in ctx.spec.stages if s.id == stage]
    if not found or not found[0].artifacts:
        raise CheckUnscorable(f"{ctx.spec.name} lists no artifacts for stage {stage}")
    return written_by_tool(ctx, paths=list(found[0].artifacts))


@register_check("unchanged")
def unchanged(
    ctx: CheckContext, *, paths: Annotated[list[str], Field(min_length=1)]
) -> CheckResult:
    """Every start-workspace file at or under ``paths`` keeps its sha256.

    Null when the start workspace has no file there: the state, not the agent, is then
    missing what the contract expects.
    """
    start = {
        p: sha
        for p in ctx.start.paths()
        if any(path_matches(p, pattern) for pattern in paths) and (sha := ctx.start.sha256(p))
    }
    if not start:
        raise CheckUnscorable(f"the start workspace has no files under {paths}")
    altered = [p for p, sha in start.items() if ctx.workspace.sha256(p) != sha]
    if altered:
        raise CheckFailed(f"changed or removed since the start: {listing(altered)}")
    evidence = tuple(Evidence.artifact(p, sha) for p, sha in start.items())
    return CheckResult.ok(f"{len(start)} start files unchanged under {paths}", evidence)


@register_check("task_metric_at_least", evidence="none")
def task_metric_at_least(
    ctx: CheckContext, *, threshold: Annotated[float, Field(ge=0, le=1)]
) -> CheckResult:
    """The benchmark's task metric on the final workspace is at least ``threshold``.

    The verifier computes the metric itself, outside every sandbox, so the result
    carries no evidence (registered with ``evidence="none"``).
    """
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the task metric cannot be computed")
    score = ctx.task.score(ctx.workspace)
    if score is None:
        raise CheckUnscorable("the benchmark could not score this task")
    if score < threshold:
        raise CheckFailed(f"task metric {score:.3f} < {threshold}")
    return CheckResult.ok(f"task metric {score:.3f} >= {threshold}")


@register_check("pilot_quality")
def pilot_quality(
    ctx: CheckContext,
    *,
    path: str,
    threshold: Annotated[float, Field(ge=0, le=1)],
    relative: bool = False,
    floor: Annotated[float, Field(ge=0, le=1)] = 1.0,
    below_floor_agree: list[str] | None = None,
) -> CheckResult:
    """The benchmark's task metric on the pilot's case(s) is at least the bar.

    The benchmark scores the pilot file (:meth:`~bat_gym.benchmark.Benchmark.pilot_score`)
    against the truth of the cases it names; this is S3's quality check. The bar is
    ``threshold``; with ``relative``, it is ``threshold`` times what the benchmark's
    reference run (a correct pipeline with the provided model) scores, so that where
    the provided model is imperfect by design (a hard tier) a correct pilot is held to
    what a correct run achieves rather than to a perfect score.

    Where the benchmark scores the reference on the pilot's own case(s)
    (:meth:`~bat_gym.benchmark.Benchmark.pilot_reference_score`), the bar is
    ``threshold * max(R_cases, floor * R_task)``, with ``R_cases`` the reference's
    metric on those cases and ``R_task`` its whole-task metric capped at 1. The floor
    keeps a policy from lowering its own bar by piloting a case the reference does
    badly on: where the reference scores 0 the bar would otherwise be 0 and any pilot
    would pass, and where it scores, say, 0.5 a mistake the metric scores 0.5 as well
    (a report with the right count and wrong sizes) would pass. The default floor, 1,
    never puts the metric bar below the whole-task one; with 0.5, MedBench-Lite's
    report mistake passed on 5 of 30 seeds piloted on the reference's worst case.

    Yet one case can score well below the task's mean even for a correct pipeline (the
    model misses a nodule there), and there the metric cannot tell a correct pipeline
    from a wrong one. So with ``below_floor_agree`` (reference files, as ``against`` of
    ``matches_reference``), a pilot on cases where ``R_cases`` is below ``floor *
    R_task`` also passes when each of its rows is the reference run's row for its case,
    the files it names agreeing by the benchmark's ``files_agree``: being the correct
    run's output is a stricter bar than any score. (A wrong pipeline whose output on
    that case happens to be the model's, say no boxes to transpose, passes too: nothing
    in the pilot tells them apart, and ``pipeline_reproduces`` reruns every case.) This
    beats refusing such cases outright (falling back to the whole-task bar), which
    fails a correct pilot there. Without a per-case reference score the bar is
    ``threshold * R_task``; without a reference run, or one the metric cannot score, it
    is ``threshold``.

    Null when there is no task oracle or the benchmark has no pilot metric. The detail
    gives the pilot's score; it gives the bar only where the bar rests on the whole
    task, so the reference's per-case score stays private, and it never gives the truth.
    """
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the pilot cannot be scored")
    if not ctx.workspace.exists(path):
        raise CheckFailed(f"{path} is missing")
    score = ctx.task.pilot_score(ctx.workspace, path)
    if score is None:
        raise CheckUnscorable("the benchmark has no pilot metric for this task")
    evidence = ctx.artifact(path)
    bar = threshold
    reference = ctx.task.reference if relative else None
    task_ref = None if reference is None else ctx.task.score(reference)
    if reference is not None and task_ref is not None:
        task_ref = min(1.0, task_ref)
        on_cases = ctx.task.pilot_reference_score(ctx.workspace, path)
        if on_cases is not None:
            # The bar itself would tell the policy how the reference does on this case.
            said = "the bar the reference run sets on the same case(s)"
            passed = score >= threshold * max(on_cases, floor * task_ref) or (
                below_floor_agree is not None
                and on_cases < floor * task_ref
                and _rows_are_the_references(ctx, reference, path, below_floor_agree)
            )
            if not passed:
                raise CheckFailed(
                    f"{path}: task metric on the pilot {score:.3f} is below {said}", evidence
                )
            return CheckResult.ok(
                f"{path}: task metric on the pilot {score:.3f} meets {said}", evidence
            )
        bar = threshold * task_ref
    if score < bar:
        raise CheckFailed(f"{path}: task metric on the pilot {score:.3f} < {bar:.3f}", evidence)
    return CheckResult.ok(f"{path}: task metric on the pilot {score:.3f} >= {bar:.3f}", evidence)


def _rows_are_the_references(
    ctx: CheckContext, reference: FrozenWorkspace, path: str, against: list[str]
) -> bool:
    """Whether every row of the CSV ``path`` is the reference's row for its case.

    A case's row is taken from the first of the reference's files ``against`` that has
    one. Cells agree as text, or, where the reference's cell names a file of its
    workspace, when the agent's cell names a file that agrees with it (same bytes, or
    the benchmark's ``files_agree``). A missing or garbled file agrees with nothing.
    """
    assert ctx.task is not None
    try:
        header, rows = read_csv(ctx.workspace, path)
    except CheckFailed:
        return False
    if not rows or not header:
        return False
    key = header[0]
    by_key: dict[str, dict[str, str]] = {}
    for other in against:
        try:
            ref_header, ref_rows = read_csv(reference, other)
        except CheckFailed:
            continue
        if ref_header[:1] == [key]:
            for r in ref_rows:
                by_key.setdefault(r[key], r)
    for row in rows:
        want = by_key.get(row[key])
        if want is None:
            return False
        for col in header[1:]:
            mine, theirs = row[col], want.get(col)
            if theirs is None:
                continue  # a column the reference does not write: nothing to compare
            ref_file, my_file = posixpath.normpath(theirs), posixpath.normpath(mine)
            if theirs and reference.sha256(ref_file) is not None:
                # The cell names a file: the same name is not enough, the contents must agree.
                if ctx.workspace.sha256(my_file) is None:
                    return False
                if ctx.workspace.sha256(my_file) != reference.sha256(ref_file) and not (
                    ctx.task.files_agree(
                        my_file, ctx.workspace.read_bytes(my_file), reference.read_bytes(ref_file)
                    )
                ):
                    return False
            elif mine != theirs:
                return False
    return True


@register_check("pilot_checked")
def pilot_checked(
    ctx: CheckContext,
    *,
    path: str,
    receipt: str,
    where: Literal["any", "risky"] = "any",
) -> CheckResult:
    """The S3 receipt states a check of the pilot that the verifier's recomputation confirms.

    The receipt at ``receipt`` holds ``"check": {"case", "name", "value", "passed"}``:
    the piloted case the agent checked, the name and value of the figure the task's own
    check computes on it, and whether the pilot passed. The benchmark recomputes that
    figure on the frozen workspace (:meth:`~bat_gym.benchmark.Benchmark.pilot_figure`).
    It passes when ``case`` is a row of the pilot at ``path``, ``name`` is the
    benchmark's figure, ``value`` is the recomputed one (a number within the figure's
    tolerance, a string exactly) and ``passed`` is what the figure says. With ``where:
    risky`` the case must also be one where the task's planted pitfall shows
    (:meth:`~bat_gym.benchmark.Benchmark.risky_cases`) and the check must have passed:
    a pilot checked on an easy case, where a wrong pipeline passes too, validates
    nothing.

    Running the pipeline on one case and writing a receipt, with no check stated, fails;
    so does a stated figure the recomputation does not confirm. Null when there is no
    task oracle or the benchmark declares no check (its ``pilot_figure`` is None). The
    detail names the stated figure, never the recomputed one.
    """
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the pilot's check cannot be recomputed")
    evidence = ctx.artifact(receipt) + ctx.artifact(path)
    try:
        header, rows = read_csv(ctx.workspace, path)
    except CheckFailed as exc:
        raise CheckFailed(exc.detail, evidence) from None
    cases = [r[header[0]] for r in rows] if header else []
    stated = _stated_check(ctx, receipt)
    case = stated.get("case") if isinstance(stated.get("case"), str) else None
    # Ask the benchmark about the stated case, or the pilot's first: whether it
    # declares a check at all does not depend on which.
    figure = ctx.task.pilot_figure(ctx.workspace, path, case or (cases[0] if cases else ""))
    if figure is None:
        raise CheckUnscorable("the benchmark declares no check figure for its pilot")
    if not stated:
        raise CheckFailed(f"{receipt} states no check of the pilot", evidence)
    name, value, passed = stated.get("name"), stated.get("value"), stated.get("passed")
    if case is None or not isinstance(name, str) or not isinstance(passed, bool):
        raise CheckFailed(
            f"{receipt}: check needs a case (string), a name (string), a value and passed (true/false)",
            evidence,
        )
    if case not in cases:
        raise CheckFailed(f"{receipt}: the checked case {case!r} is not a row of {path}", evidence)
    said = f"{name} = {value!r} on {case}"
    if name != figure.name:
        raise CheckFailed(
            f"{receipt}: {said} is not the figure the task's check computes", evidence
        )
    if not _figure_agrees(value, figure.value, figure.tolerance):
        raise CheckFailed(
            f"{receipt}: the stated {said} is not what the task's check computes on the pilot",
            evidence,
        )
    if passed != figure.passed:
        raise CheckFailed(
            f"{receipt}: the check of {case} is stated as {'passed' if passed else 'failed'}, "
            "which its figure does not bear out",
            evidence,
        )
    if where == "risky":
        risky = ctx.task.risky_cases
        if risky is not None and case not in risky:
            raise CheckFailed(
                f"{receipt}: {case} is not a case where the task's pitfall shows; "
                "a wrong pipeline passes a check there too",
                evidence,
            )
        if not passed:
            raise CheckFailed(f"{receipt}: the check of {case} failed", evidence)
        return CheckResult.ok(f"{receipt}: {said} confirmed on a risky case, passed", evidence)
    return CheckResult.ok(f"{receipt}: {said} confirmed", evidence)


def _stated_check(ctx: CheckContext, receipt: str) -> dict[str, object]:
    """The receipt's ``check`` object; empty when the receipt is missing or states none."""
    if not ctx.workspace.exists(receipt):
        return {}
    try:
        body = read_json(ctx.workspace, receipt)
    except CheckFailed:
        return {}
    check = body.get("check") if isinstance(body, dict) else None
    return check if isinstance(check, dict) else {}


def _figure_agrees(stated: object, computed: float | str | None, tolerance: float) -> bool:
    """Whether a stated figure is the computed one: numbers within ``tolerance``, strings exactly."""
    if computed is None:
        return False
    if isinstance(computed, str):
        return isinstance(stated, str) and stated.strip() == computed.strip()
    if isinstance(stated, bool) or not isinstance(stated, (int, float)):
        return False
    return math.isfinite(stated) and abs(stated - computed) <= tolerance


@register_check("matches_answers")
def matches_answers(
    ctx: CheckContext,
    *,
    path: str,
    answers_key: str,
    key_column: str = "id",
    value_column: str = "label",
    min_rows: Annotated[int, Field(ge=1)] = 1,
) -> CheckResult:
    """Every row of a CSV agrees with the task's private answers.

    ``answers[answers_key]`` maps a key (case id) to the right value. Each row's key
    must be one of them and its value must equal the answer. The detail says how many
    rows disagree, never what the answers are.
    """
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: private answers are unavailable")
    truth = ctx.task.answers.get(answers_key)
    if not isinstance(truth, dict):
        raise CheckUnscorable(f"the private answers hold no mapping {answers_key!r}")
    header, rows = read_csv(ctx.workspace, path)
    evidence = ctx.artifact(path)
    for column in (key_column, value_column):
        if column not in header:
            raise CheckFailed(f"{path} has no column {column!r}", evidence)
    if len(rows) < min_rows:
        raise CheckFailed(f"{path} has {len(rows)} rows, fewer than {min_rows}", evidence)
    wrong = [
        str(n)
        for n, r in enumerate(rows, start=2)
        if r[key_column] not in truth or not states_answer(r[value_column], truth[r[key_column]])
    ]
    if wrong:
        raise CheckFailed(
            f"{path}: {len(wrong)} of {len(rows)} rows disagree with the private answers (lines {listing(wrong)})",
            evidence,
        )
    return CheckResult.ok(f"{path}: all {len(rows)} rows agree with the private answers", evidence)


def _explain_no_success(matching: list[ToolCallRecord], subject: str, what: str) -> NoReturn:
    """Raise why none of the ``matching`` calls counts: null after a restart, else failed.

    ``subject`` opens the sentences about a call ("a call running ..."); ``what`` follows
    "no" when there was no such call at all.
    """
    restarted = [c.index for c in matching if c.restarted]
    if restarted:
        raise CheckUnscorable(
            f"{subject} was cut short by a sandbox restart (call #{restarted[-1]})"
        )
    if not matching:
        raise CheckFailed(f"no {what}")
    last = matching[-1]
    why = (
        "timed out"
        if last.timed_out
        else f"exited {last.exit_code}"
        if not last.succeeded
        else "did not change the workspace"
    )
    raise CheckFailed(
        f"{subject} never succeeded: call #{last.index} {why}", (Evidence.execution(last.index),)
    )
