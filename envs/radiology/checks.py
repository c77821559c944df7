"""Reference checks for what the agent stored on the DICOM server through the tools.

The server keeps what the tools stored (findings on a study, annotations on a series);
the env records each call the server accepted (:class:`~bat_gym.core.record.ToolUseRecord`,
status ``ok``, with the validated arguments it stored). These checks read those
records and compare them with the verifier's own measurement, which the suite's
private answers carry (:meth:`Radiology._truth
<bat_gym.envs.radiology.suite.Radiology._truth>`: the model run on the series the model
card names, and that series' lesion voxels). Nothing the agent says about its work
counts, and a stored record is never its own proof:

* ``radiology_findings``: every patient's current study holds a finding, and *every*
  finding stored is right: on the series the model card measures (not the one its
  description names), the diameter within ``tolerance_mm`` of the verifier's, the
  change the same; and each agrees with the patient's row of the agent's own
  submission, so a number typed in from a tool's output, without the pipeline's run
  behind the submission, does not pass. A finding on any other study (a prior one, a
  made-up UID the server refused) fails it too: the server must hold no wrong record.
* ``radiology_annotations``: every patient's lesion is marked on that series, and every
  mark stored there and on the patient's other current series lies on a lesion voxel
  (its slice, its rounded row and column) with the verifier's diameter.

Details name the patient and what disagrees, never the verifier's value.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from bat_gym.core.record import ToolUseRecord
from bat_gym.rubrics.contract.checks import register_check
from bat_gym.rubrics.contract.context import (
    CheckContext,
    CheckFailed,
    CheckResult,
    CheckUnscorable,
    Evidence,
)

__all__ = ["annotations_mark_lesions", "findings_match_measurement"]


def _patients(ctx: CheckContext) -> dict[str, dict[str, Any]]:
    if ctx.task is None:
        raise CheckUnscorable("no task oracle: the verifier's measurement is unavailable")
    patients = dict(ctx.task.answers.get("patients") or {})
    if not patients or not all("series_uid" in p for p in patients.values()):
        raise CheckUnscorable("the task's answers carry no reference measurement")
    return patients


def _stored(ctx: CheckContext, tool: str) -> list[ToolUseRecord]:
    """The calls of ``tool`` the server accepted (status ok), in order."""
    return [u for u in ctx.record.tool_uses if u.name == tool and u.succeeded]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _submission_rows(ctx: CheckContext, path: str) -> tuple[dict[str, dict[str, str]], Evidence]:
    digest = ctx.workspace.sha256(path)
    if digest is None:
        raise CheckFailed(f"{path} is missing: a finding must restate the submitted measurement")
    try:
        rows = list(csv.DictReader(io.StringIO(ctx.workspace.read_text(path))))
    except (OSError, ValueError, csv.Error) as exc:
        raise CheckFailed(f"{path} cannot be read as CSV ({type(exc).__name__})") from None
    by_id: dict[str, dict[str, str]] = {}
    for row in rows:
        by_id.setdefault((row.get("id") or "").strip(), row)
    return by_id, Evidence.artifact(path, digest)


@register_check("radiology_findings")
def findings_match_measurement(
    ctx: CheckContext,
    *,
    submission: str = "outputs/submission.csv",
    tolerance_mm: float = 0.05,
) -> CheckResult:
    """Every stored finding is the verifier's measurement and the submission's (module docs).

    Passes when each patient's current study holds at least one finding and every
    finding the server accepted names a patient's current study, the series the model
    measures there, a ``lesion_diameter_mm`` within ``tolerance_mm`` of the verifier's
    diameter and of the patient's ``diameter_mm`` in ``submission``, and the same
    ``change`` as both. Evidence: the finding calls and the submission file.
    """
    patients = _patients(ctx)
    by_study = {p["study_uid"]: pid for pid, p in patients.items()}
    finds = _stored(ctx, "submit_finding")
    calls = tuple(Evidence.execution(u.index) for u in finds)
    if not finds:
        raise CheckFailed("no finding was stored (submit_finding)")
    rows, file_evidence = _submission_rows(ctx, submission)
    seen: set[str] = set()
    for use in finds:
        args = use.arguments
        pid = by_study.get(str(args.get("study_uid")))
        where = f"finding #{use.index}"
        if pid is None:
            raise CheckFailed(f"{where} is on a study that is no patient's current study", calls)
        want, row = patients[pid], rows.get(pid)
        if args.get("series_uid") != want["series_uid"]:
            raise CheckFailed(
                f"{where} ({pid}) names a series the model card does not measure", calls
            )
        given = _number(args.get("lesion_diameter_mm"))
        if given is None or abs(given - want["diameter_mm"]) > tolerance_mm:
            raise CheckFailed(
                f"{where} ({pid}): the diameter disagrees with the verifier's measurement", calls
            )
        if args.get("change") != want["change"]:
            raise CheckFailed(f"{where} ({pid}): the change disagrees with the measurement", calls)
        if row is None:
            raise CheckFailed(f"{where} ({pid}): {submission} has no row for the patient", calls)
        try:
            submitted = float(row.get("diameter_mm") or "nan")
        except ValueError:
            submitted = math.nan
        if not abs(given - submitted) <= tolerance_mm or (row.get("change") or "").strip() != (
            args.get("change")
        ):
            raise CheckFailed(
                f"{where} ({pid}) does not restate the patient's row of {submission}",
                (*calls, file_evidence),
            )
        seen.add(pid)
    missing = sorted(set(patients) - seen)
    if missing:
        raise CheckFailed(f"no finding for {', '.join(missing)}", calls)
    return CheckResult.ok(
        f"{len(finds)} finding(s), each patient's, all agree with the measurement",
        (*calls, file_evidence),
    )


@register_check("radiology_annotations")
def annotations_mark_lesions(ctx: CheckContext, *, tolerance_mm: float = 0.05) -> CheckResult:
    """Each patient's lesion is marked, and every mark on a current study is right (module docs).

    Passes when each patient's measured series holds at least one annotation, and every
    annotation the server accepted on a series of a patient's current study is on the
    measured series, centred on one of its lesion voxels, with a ``diameter_mm``
    within ``tolerance_mm`` of the verifier's. Evidence: the annotation calls.
    """
    patients = _patients(ctx)
    by_series = {p["series_uid"]: pid for pid, p in patients.items()}
    marks = _stored(ctx, "store_annotation")
    calls = tuple(Evidence.execution(u.index) for u in marks)
    if not marks:
        raise CheckFailed("no annotation was stored (store_annotation)")
    voxels = {pid: {tuple(v) for v in p.get("lesion_voxels") or ()} for pid, p in patients.items()}
    # Every series of a current study: a mark there must be on the measured series.
    current = {uid for p in patients.values() for uid in p.get("current_series") or ()}
    seen: set[str] = set()
    for use in marks:
        args = use.arguments
        where = f"annotation #{use.index}"
        pid = by_series.get(str(args.get("series_uid")))
        if pid is None:
            # A prior study's series may carry marks of its own; a current study's other
            # series (the T1 an MR description calls T2) may not.
            if str(args.get("series_uid")) in current:
                raise CheckFailed(f"{where} is not on the series the model measures", calls)
            continue
        at = (args.get("index"), _rounded(args.get("row")), _rounded(args.get("col")))
        if at not in voxels[pid]:
            raise CheckFailed(f"{where} ({pid}) is not on the lesion", calls)
        given = _number(args.get("diameter_mm"))
        if given is None or abs(given - patients[pid]["diameter_mm"]) > tolerance_mm:
            raise CheckFailed(
                f"{where} ({pid}): the diameter disagrees with the verifier's measurement", calls
            )
        seen.add(pid)
    missing = sorted(set(patients) - seen)
    if missing:
        raise CheckFailed(f"no lesion mark for {', '.join(missing)}", calls)
    return CheckResult.ok(f"{len(seen)} patient(s) marked; every mark is on the lesion", calls)


def _rounded(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(math.floor(number + 0.5))
