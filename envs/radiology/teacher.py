"""The radiology teacher and naive baseline: scripted turns that run real sandbox code.

The teacher plans, writes the pipeline (``scripts/``, read by :mod:`.sandbox_code`),
pilots it on one patient against the model card, runs every patient, submits, and
stores each lesion's mark and finding on the Orthanc server through the DICOM tools.
The naive baseline skips the plan and the pilot and runs a pipeline that trusts series
descriptions and stored values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bat_gym.benchmark import TeacherTurn
from bat_gym.envs.radiology import sandbox_code
from bat_gym.envs.radiology.studies import PatientSpec, _uid
from bat_gym.protocol import ToolCall, bash_call, python_call

__all__ = ["naive_turns", "stage_turns", "teacher_turns"]


def teacher_turns(
    track: str, patients: list[tuple[int, PatientSpec]], truth: dict[str, dict[str, Any]]
) -> list[TeacherTurn]:
    """The teacher's turns on a task of ``track`` with these patients and the model's truth.

    The stage scripts of :func:`stage_turns`, the first turn preceded by a look at the
    server (the studies, the current study's series, its last series' header), and
    before the finish the marks and findings stored on the server.

    Args:
        track: ``lesion_growth`` or ``nodule_dx``.
        patients: ``(seed, patient)`` pairs, as :meth:`Radiology._patients` draws them.
        truth: the model's measurements by patient id (:meth:`Radiology._truth`).
    """
    truth_free_first = patients[0][1]
    current = truth_free_first.studies[-1]
    inspect = (
        ToolCall(name="find_studies", arguments={}),
        ToolCall(name="list_series", arguments={"study_uid": current.uid}),
    )
    series_uid = _uid("series", current.uid, current.series[-1].number)
    meta = ToolCall(name="series_metadata", arguments={"series_uid": series_uid})
    turns = stage_turns(len(patients), track)
    turns[0] = TeacherTurn(turns[0].stage, turns[0].content, (*inspect, meta, *turns[0].calls))
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
    submit_at = len(turns) - 1
    turns.insert(
        submit_at,
        TeacherTurn(
            "S5",
            "Marking each lesion and submitting the findings on the server.",
            (*marks, *findings),
        ),
    )
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


def stage_turns(patients: int, track: str) -> list[TeacherTurn]:
    """The five stages' scripts and the finish, for ``patients`` patients of ``track``."""
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
    setup = sandbox_code.stage_script("s2_setup", pipeline=sandbox_code.pipeline())
    validate = sandbox_code.stage_script(
        "s3_validate", check=sandbox_code.CHECK, receipt=sandbox_code.RECEIPT
    )
    infer = sandbox_code.stage_script("s4_infer", receipt=sandbox_code.RECEIPT)
    submit = sandbox_code.stage_script("s5_submit", receipt=sandbox_code.RECEIPT)
    return [
        TeacherTurn(
            "S1", "I will look at the studies on the server and write the plan.", (bash_call(plan),)
        ),
        TeacherTurn(
            "S2", "Recording the environment and writing the pipeline.", (python_call(setup),)
        ),
        TeacherTurn(
            "S3",
            "A one-patient pilot where a trap shows, checked against the model card.",
            (python_call(validate),),
        ),
        TeacherTurn("S4", "Every patient.", (python_call(infer),)),
        TeacherTurn("S5", "The submission in the required schema.", (python_call(submit),)),
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
