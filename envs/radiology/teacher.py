"""The radiology teacher and naive baseline: scripted turns that run real sandbox code.

The teacher plans, writes the pipeline (``scripts/``, read by :mod:`.sandbox_code`),
pilots it on one patient against the model card, runs every patient, submits, and
stores each lesion's mark and finding on the Orthanc server through the DICOM tools.
The naive baseline skips the plan and the pilot and runs a pipeline that trusts series
descriptions and stored values.

Outcomes: ``success``; ``recovery`` writes the naive baseline's pipeline in S2 (the
realistic mistake: stored values and descriptions trusted), the S3 check fails on the
patient where a trap shows, and the next turn writes the right pipeline and pilots
again; ``failure`` pilots that pipeline with a shape-only check, which cannot see the
traps, and submits its numbers (no marks or findings on the server). Rows cut after
the mistake went in (S3 of ``recovery`` and ``failure``, S4 and S5 of ``failure``) are
repair exercises (:func:`repair_turns`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.protocol import ToolCall, bash_call, python_call
from bat_gym.core.repair_record import (
    STAGE_RECEIPTS,
    pipeline_reasons,
    record_stage_call,
    start_call,
    starts_with_s2_mistake,
    write_file_call,
)
from bat_gym.envs.radiology import sandbox_code
from bat_gym.envs.radiology.studies import PatientSpec, _uid

__all__ = [
    "OUTCOMES",
    "carries_mistake",
    "naive_turns",
    "repair_turns",
    "stage_turns",
    "teacher_turns",
]

OUTCOMES = ("success", "recovery", "failure")

# What the teacher says when the S3 check shows the mistake, per track, and the fix.
_BUG_SEEN = {
    "lesion_growth": "CHECK FAILED: the pilot's diameters are not the model card's reading of "
    "the same patient: the pipeline trusts the stored values and the series descriptions (no "
    "CT rescale to HU; the MR series picked by its description, not its echo time).",
    "nodule_dx": "CHECK FAILED: the pilot's diameters are not the model card's reading of the "
    "same patient: the pipeline trusts the radiograph as stored (MONOCHROME1 not inverted; "
    "the detector's spacing not divided by the magnification).",
}
_FIX = (
    "Rewriting pipeline/infer.py to read the studies as the model card says, then piloting again."
)


def teacher_turns(
    track: str,
    patients: list[tuple[int, PatientSpec]],
    truth: dict[str, dict[str, Any]],
    outcome: str = "success",
    *,
    trap_shows: bool = True,
) -> list[TeacherTurn]:
    """The teacher's turns on a task of ``track`` with these patients and the model's truth.

    The stage scripts of :func:`stage_turns`, the first turn preceded by a look at the
    server (the studies, the current study's series, its last series' header), and
    before the finish the marks and findings stored on the server (not in ``failure``,
    whose numbers are wrong).

    Args:
        track: ``lesion_growth`` or ``nodule_dx``.
        patients: ``(seed, patient)`` pairs, as :meth:`Radiology._patients` draws them.
        truth: the model's measurements by patient id (:meth:`Radiology._truth`).
        outcome: one of :data:`OUTCOMES`.
        trap_shows: whether some patient's current study holds a trap; where none does,
            ``recovery``'s pilot passes and it goes on with the pipeline it wrote.

    Raises:
        ValueError: an unknown outcome.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    truth_free_first = patients[0][1]
    current = truth_free_first.studies[-1]
    inspect = (
        ToolCall(name="find_studies", arguments={}),
        ToolCall(name="list_series", arguments={"study_uid": current.uid}),
    )
    series_uid = _uid("series", current.uid, current.series[-1].number)
    meta = ToolCall(name="series_metadata", arguments={"series_uid": series_uid})
    turns = stage_turns(len(patients), track, outcome, trap_shows=trap_shows)
    turns[0] = TeacherTurn(turns[0].stage, turns[0].content, (*inspect, meta, *turns[0].calls))
    if outcome != "failure":
        turns.insert(len(turns) - 1, _server_turn(patients, truth))
    return turns


def _server_turn(
    patients: list[tuple[int, PatientSpec]], truth: dict[str, dict[str, Any]]
) -> TeacherTurn:
    """S5's turn on the server: each lesion's mark and each patient's finding."""
    findings: list[ToolCall] = []
    marks: list[ToolCall] = []
    for _seed, patient in patients:
        want = truth[patient.patient_id]
        # The pipeline's numbers, read back from the submission by the agent in a
        # real run; the scripted teacher knows them beforehand. Likewise the mark:
        # the lesion voxel nearest the lesion's centroid.
        findings.append(
            ToolCall(
                name="submit_finding",
                arguments={
                    "study_uid": want["study_uid"],
                    "series_uid": want["series_uid"],
                    "lesion_diameter_mm": want["diameter_mm"],
                    "change": want["change"],
                },
            )
        )
        voxels = np.asarray(want["lesion_voxels"], dtype=float)
        k, r, c = voxels[np.argmin(((voxels - voxels.mean(axis=0)) ** 2).sum(axis=1))]
        marks.append(
            ToolCall(
                name="store_annotation",
                arguments={
                    "series_uid": want["series_uid"],
                    "index": int(k),
                    "row": float(r),
                    "col": float(c),
                    "diameter_mm": want["diameter_mm"],
                    "label": "lesion",
                },
            )
        )
    return TeacherTurn(
        "S5", "Marking each lesion and submitting the findings on the server.", (*marks, *findings)
    )


def carries_mistake(focus: str, outcome: str, *, trap_shows: bool = True) -> bool:
    """Whether a row of ``outcome``'s trajectory at ``focus`` starts with the naive pipeline.

    The S3 row of ``recovery`` and ``failure``, the S4 and S5 rows of ``failure``
    (:func:`~bat_gym.core.repair_record.starts_with_s2_mistake`); none where no patient's
    current study holds a trap (the naive reading is then right).
    """
    return trap_shows and starts_with_s2_mistake(focus, outcome)


def repair_turns(
    track: str,
    patients: list[tuple[int, PatientSpec]],
    truth: dict[str, dict[str, Any]],
    focus: str,
    outcome: str,
    *,
    trap_shows: bool = True,
) -> list[TeacherTurn]:
    """The teacher's turns for stage ``focus`` from a row that starts with the naive pipeline.

    ``[]`` for a row that does not (:func:`carries_mistake`). Otherwise: keep the start
    state's sha256s, run the S3 check on the patient where a trap shows (it fails: the
    evidence), write the right pipeline and pilot again, in S4 and S5 run every patient
    again (and submit), record every earlier file the repair changed in the stage's
    receipt, and in S5 store the marks and findings on the server.

    Args:
        track: ``lesion_growth`` or ``nodule_dx``.
        patients: the task's ``(seed, patient)`` pairs.
        truth: the model's measurements by patient id.
        focus: the row's stage, ``S1``..``S5``.
        outcome: the outcome of the trajectory the row was cut from.
        trap_shows: whether some patient's current study holds a trap.
    """
    if not carries_mistake(focus, outcome, trap_shows=trap_shows):
        return []
    scripts = _scripts()
    look = (
        "A one-patient pilot where a trap shows, checked against the model card."
        if focus == "S3"
        else "The S3 receipt records only a shape check, which cannot see the traps; before "
        "going on I run the model card's check on the patient where a trap shows."
    )
    turns = [
        TeacherTurn(focus, look, (start_call(), python_call(scripts["validate"]))),
        TeacherTurn(
            focus,
            _BUG_SEEN[track] + " " + _FIX,
            (
                write_file_call("pipeline/infer.py", sandbox_code.pipeline()),
                python_call(scripts["validate"]),
            ),
        ),
    ]
    if focus in ("S4", "S5"):
        turns.append(
            TeacherTurn(
                focus,
                "The repaired pilot passes; every patient again.",
                (python_call(scripts["infer"]),),
            )
        )
    if focus == "S5":
        turns.append(
            TeacherTurn(
                focus, "The submission in the required schema.", (python_call(scripts["submit"]),)
            )
        )
    evidence = "the S3 check failed on the pilot patient: " + _BUG_SEEN[track]
    turns.append(
        TeacherTurn(
            focus,
            f"Recording the repair in {STAGE_RECEIPTS[focus][0]}: each earlier file it "
            "changed, with its sha256 before and after.",
            (record_stage_call(focus, pipeline_reasons(evidence)),),
        )
    )
    if focus == "S5":
        turns.append(_server_turn(patients, truth))
    return turns


def naive_turns() -> list[TeacherTurn]:
    """No plan and no pilot; a pipeline that trusts descriptions and stored values."""
    setup = sandbox_code.stage_script("naive_s2_setup", pipeline=sandbox_code.naive_pipeline())
    return [
        TeacherTurn("S2", "Writing the pipeline.", (python_call(setup),)),
        TeacherTurn(
            "S4",
            "Running every patient.",
            (bash_call("mkdir -p outputs && python pipeline/infer.py outputs/predictions.csv"),),
        ),
        TeacherTurn(
            "S5", "Submitting.", (bash_call("cp outputs/predictions.csv outputs/submission.csv"),)
        ),
        TeacherTurn("S5", "Done.", (ToolCall(name="finish", arguments={"summary": "Submitted."}),)),
    ]


_DX_PLAN = (
    "{n} patients, each with a prior and a current chest radiograph in data/dicom (and on the "
    "server). A MONOCHROME1 radiograph stores bright anatomy as low values: invert it "
    "(2**BitsStored - 1 - stored) before the threshold. ImagerPixelSpacing is the detector's "
    "spacing: divide it by EstimatedRadiographicMagnificationFactor for the spacing at the "
    "patient.\n\n## Inference\nRun measure_2d from model/measure.py with the model.json DX "
    "threshold on each radiograph, in pipeline/infer.py."
)


def _scripts() -> dict[str, str]:
    """The S3 to S5 stage scripts, slots filled."""
    return {
        "validate": sandbox_code.stage_script(
            "s3_validate", check=sandbox_code.CHECK, receipt=sandbox_code.RECEIPT
        ),
        "shape": sandbox_code.stage_script("s3_shape_pilot", receipt=sandbox_code.RECEIPT),
        "infer": sandbox_code.stage_script("s4_infer", receipt=sandbox_code.RECEIPT),
        "submit": sandbox_code.stage_script("s5_submit", receipt=sandbox_code.RECEIPT),
    }


def stage_turns(
    patients: int, track: str, outcome: str = "success", *, trap_shows: bool = True
) -> list[TeacherTurn]:
    """The five stages' scripts and the finish, for ``patients`` patients of ``track``.

    ``recovery`` and ``failure`` write the naive pipeline in S2; ``recovery`` then
    fixes it in S3 where its check fails (where a trap shows), ``failure`` pilots it
    with the shape-only check.
    """
    body = (
        _DX_PLAN.format(n=patients)
        if track == "nodule_dx"
        else (
            f"{patients} patients, each with a prior and a current study in data/dicom (and on "
            "the server). For CT, apply the header rescale (RescaleSlope, RescaleIntercept) so "
            "values are HU before thresholding. For MR, measure the T2 series, chosen by its echo "
            "time (TE > 60 ms), not by its description.\n\n## Inference\nStack each series in "
            "InstanceNumber order and run model/measure.py with the model.json threshold, in "
            "pipeline/infer.py."
        )
    )
    plan = (
        "mkdir -p plan && cat > plan/plan.md <<'EOF'\n# Plan\n\n## Preprocess\n"
        f"{body}\n\n## Postprocess\n"
        "Write id,diameter_mm,prior_mm,change per patient in the schema of task.json, with receipts, "
        "mark each lesion and submit each finding on the server.\nEOF\n"
        "cat task.json; cat model/model.json"
    )
    pipeline = sandbox_code.pipeline() if outcome == "success" else sandbox_code.naive_pipeline()
    setup = sandbox_code.stage_script("s2_setup", pipeline=pipeline)
    scripts = _scripts()
    if outcome == "failure":
        validate = [
            TeacherTurn(
                "S3",
                "A one-patient pilot, to check that the pipeline writes its CSV.",
                (python_call(scripts["shape"]),),
            )
        ]
    else:
        validate = [
            TeacherTurn(
                "S3",
                "A one-patient pilot where a trap shows, checked against the model card.",
                (python_call(scripts["validate"]),),
            )
        ]
        if outcome == "recovery" and trap_shows:
            validate.append(
                TeacherTurn(
                    "S3",
                    _BUG_SEEN[track] + " " + _FIX,
                    (
                        write_file_call("pipeline/infer.py", sandbox_code.pipeline()),
                        python_call(scripts["validate"]),
                    ),
                )
            )
    return [
        TeacherTurn(
            "S1", "I will look at the studies on the server and write the plan.", (bash_call(plan),)
        ),
        TeacherTurn(
            "S2", "Recording the environment and writing the pipeline.", (python_call(setup),)
        ),
        *validate,
        TeacherTurn("S4", "Every patient.", (python_call(scripts["infer"]),)),
        TeacherTurn(
            "S5", "The submission in the required schema.", (python_call(scripts["submit"]),)
        ),
        TeacherTurn(
            "S5",
            "All stages are done.",
            (
                ToolCall(
                    name="finish",
                    arguments={"summary": "Submitted outputs/submission.csv and the findings."},
                ),
            ),
        ),
    ]
