"""toy_pipeline's scripted teacher and naive baseline, built from the scripts in ``scripts/``.

The success path is six turns: plan, setup (the environment record and the track's
pipeline), a one-case pilot checked where the track's trap shows, inference, the
submission, finish. The two other outcomes make the track's realistic mistake in S2,
the pipeline that misses the trap (values taken as centimetres; codes taken as
written):

* ``recovery``: the S3 check fails on the risky case, and the next turn fixes the
  pipeline and pilots again;
* ``failure``: the pilot is checked for shape only, which cannot see the trap, and the
  mistake is carried through to the submission.

On a task where the trap changes no score (values already in centimetres), the mistaken
pipeline computes what the right one does: there is nothing to recover from, so
``recovery``'s check passes and the teacher keeps the pipeline, saying why, and
``failure``'s rows carry no defect.

Rows cut after the mistake went in (the S3 rows of ``recovery`` and ``failure``, the S4
and S5 rows of ``failure``) start with the mistaken pipeline in place. From such a row
the teacher plays a repair exercise (:func:`repair_turns`): the S3 check on the risky
case shows the mistake, the pipeline is fixed in the open, the pilot (and inference)
run again, and the stage's receipt records each earlier file the repair changed
(:mod:`bat_gym.core.repair_record`).
"""

from __future__ import annotations

from pathlib import Path

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
from bat_gym.core.scripts import fill_slots, without_docstring

__all__ = [
    "OUTCOMES",
    "PIPELINE",
    "MISTAKEN_PIPELINE",
    "teacher_turns",
    "naive_turns",
    "repair_turns",
    "carries_mistake",
]

OUTCOMES = ("success", "recovery", "failure")

_SCRIPTS = Path(__file__).with_name("scripts")


def _script(name: str) -> str:
    """The text of ``scripts/<name>.py``, as it is on disk."""
    return (_SCRIPTS / f"{name}.py").read_text(encoding="utf-8")


def _stage(name: str, **slots: object) -> str:
    """A stage script of ``scripts/``, docstring left out, slots filled."""
    return fill_slots(without_docstring(_script(name)), f"scripts/{name}.py", **slots)


# The receipt helper the S3-S5 scripts end with, and the pipeline of each track (sent
# whole: the teacher writes it to pipeline/infer.py).
_RECEIPT = without_docstring(_script("receipt"))
PIPELINE = {track: _script(f"{track}_infer") for track in ("threshold", "lookup")}

# The track's realistic mistake, which the naive baseline also ships: the right
# pipeline less the unit conversion or the code normalization.
MISTAKEN_PIPELINE = {
    "threshold": PIPELINE["threshold"].replace(" * SCALE[unit]", ""),
    "lookup": PIPELINE["lookup"].replace(
        'model["table"][r["code"].strip().lower()]', 'model["table"].get(r["code"], 0.0)'
    ),
}
assert all(MISTAKEN_PIPELINE[t] != PIPELINE[t] for t in PIPELINE)

# What the teacher says when the S3 check shows the mistake, and how it fixes it.
_BUG_SEEN = {
    "threshold": "CHECK FAILED: the pilot's score is the model's score of the value read as "
    "centimetres, but task.json gives the values in another unit.",
    "lookup": "CHECK FAILED: the pilot's score is not the table's: the pipeline looks the "
    "code up as written, and the table has only lower-case codes without spaces.",
}
_FIX = {
    "threshold": "Fixing pipeline/infer.py to convert each value to centimetres before "
    "scoring, then piloting again.",
    "lookup": "Fixing pipeline/infer.py to strip and lower-case each code before the "
    "lookup, then piloting again.",
}


def _validate(track: str) -> ToolCall:
    check = without_docstring(_script(f"{track}_check"))
    return python_call(_stage("s3_validate", check=check, receipt=_RECEIPT))


def _infer() -> ToolCall:
    return python_call(_stage("s4_infer", receipt=_RECEIPT))


def _submit() -> ToolCall:
    return python_call(_stage("s5_submit", receipt=_RECEIPT))


def _finish(summary: str) -> ToolCall:
    return ToolCall(name="finish", arguments={"summary": summary})


def _plan(track: str, cases: int, unit: str) -> ToolCall:
    return bash_call(
        "mkdir -p plan && cat > plan/plan.md <<'EOF'\n# Plan\n\n## Preprocess\n"
        f"Read data/cases.csv ({cases} cases) and task.json; "
        + (
            f"convert the values from {unit} to cm, the model's unit."
            if track == "threshold"
            else "strip and lower-case the codes, as the model card says."
        )
        + "\n\n## Inference\nApply the model in "
        "pipeline/infer.py, one row per case id.\n\n## Postprocess\nWrite outputs/submission.csv in the schema of "
        "task.json with four-decimal scores and a receipt.\nEOF\ncat task.json; head -3 data/cases.csv"
    )


def teacher_turns(
    track: str, *, cases: int, unit: str, outcome: str = "success", trap_shows: bool = True
) -> list[TeacherTurn]:
    """The teacher's turns for one task, stage by stage, ending in finish.

    Args:
        track: ``threshold`` or ``lookup``.
        cases: the task's number of cases (the plan states it).
        unit: the threshold track's value unit (``""`` for lookup).
        outcome: one of :data:`OUTCOMES`.
        trap_shows: whether the track's trap changes some case's score; where it does
            not, ``recovery``'s check passes and the pipeline is kept.

    Raises:
        ValueError: an unknown outcome.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    pipeline = PIPELINE[track] if outcome == "success" else MISTAKEN_PIPELINE[track]
    turns = [
        TeacherTurn("S1", "I will read the task and write the plan.", (_plan(track, cases, unit),)),
        TeacherTurn(
            "S2",
            "Setting up the environment record and the pipeline.",
            (python_call(_stage("s2_setup", pipeline=pipeline)),),
        ),
    ]
    if outcome == "failure":
        shape = python_call(_stage("s3_shape_pilot", receipt=_RECEIPT))
        turns.append(
            TeacherTurn(
                "S3", "A one-case pilot, to check that the pipeline writes its CSV.", (shape,)
            )
        )
    else:
        turns.append(
            TeacherTurn(
                "S3", "A one-case pilot, checked against the data description.", (_validate(track),)
            )
        )
        if outcome == "recovery" and trap_shows:
            turns.append(
                TeacherTurn(
                    "S3",
                    _BUG_SEEN[track] + " " + _FIX[track],
                    (write_file_call("pipeline/infer.py", PIPELINE[track]), _validate(track)),
                )
            )
        elif outcome == "recovery":
            turns.append(
                TeacherTurn(
                    "S3",
                    "CHECK OK: the values are already in centimetres, so the pipeline, which "
                    "converts nothing, scores them as the card does. Keeping it.",
                    (bash_call("cat validation/s3_validation.json"),),
                )
            )
    turns += [
        TeacherTurn("S4", "Full inference.", (_infer(),)),
        TeacherTurn("S5", "Submission in the required schema.", (_submit(),)),
        TeacherTurn("S5", "All stages are done.", (_finish("Submitted outputs/submission.csv."),)),
    ]
    return turns


def carries_mistake(focus: str, outcome: str, *, trap_shows: bool = True) -> bool:
    """Whether a row of ``outcome``'s trajectory at ``focus`` starts with a defective pipeline.

    The S3 row of ``recovery`` and ``failure``, the S4 and S5 rows of ``failure``
    (:func:`~bat_gym.core.repair_record.starts_with_s2_mistake`); none where the trap
    changes no score.
    """
    return trap_shows and starts_with_s2_mistake(focus, outcome)


def repair_turns(
    track: str, focus: str, outcome: str, *, trap_shows: bool = True
) -> list[TeacherTurn]:
    """The teacher's turns for stage ``focus`` from a row that starts with the mistaken pipeline.

    ``[]`` for a row that does not (:func:`carries_mistake`). Otherwise: keep the start
    state's sha256s, run the S3 check on the case where the trap shows (it fails: the
    evidence), write the right pipeline and pilot again, in S4 and S5 run every case
    again (and submit), then record every earlier file the repair changed in the
    stage's receipt.

    Args:
        track: ``threshold`` or ``lookup``.
        focus: the row's stage, ``S1``..``S5``.
        outcome: the outcome of the trajectory the row was cut from.
        trap_shows: whether the track's trap changes some case's score.
    """
    if not carries_mistake(focus, outcome, trap_shows=trap_shows):
        return []
    look = (
        "A one-case pilot, checked against the data description."
        if focus == "S3"
        else "The S3 receipt records only a shape check, which cannot see the track's "
        "trap; before going on I run the check on the case where the trap shows."
    )
    turns = [
        TeacherTurn(focus, look, (start_call(), _validate(track))),
        TeacherTurn(
            focus,
            _BUG_SEEN[track] + " " + _FIX[track],
            (write_file_call("pipeline/infer.py", PIPELINE[track]), _validate(track)),
        ),
    ]
    if focus in ("S4", "S5"):
        turns.append(
            TeacherTurn(focus, "The repaired pilot passes; running every case again.", (_infer(),))
        )
    if focus == "S5":
        turns.append(TeacherTurn(focus, "Submission in the required schema.", (_submit(),)))
    evidence = "the S3 check failed on the pilot case: " + _BUG_SEEN[track]
    turns.append(
        TeacherTurn(
            focus,
            f"Recording the repair in {STAGE_RECEIPTS[focus][0]}: each earlier file it "
            "changed, with its sha256 before and after.",
            (record_stage_call(focus, pipeline_reasons(evidence)),),
        )
    )
    return turns


def naive_turns(track: str) -> list[TeacherTurn]:
    """The naive baseline: the mistaken pipeline on every case, unvalidated, submitted."""
    setup = _stage("naive_s2_setup", pipeline=MISTAKEN_PIPELINE[track])
    run = "mkdir -p outputs && python pipeline/infer.py outputs/predictions.csv"
    submit = "cp outputs/predictions.csv outputs/submission.csv"
    return [
        TeacherTurn("S2", "Writing the pipeline.", (python_call(setup),)),
        TeacherTurn("S4", "Running every case.", (bash_call(run),)),
        TeacherTurn("S5", "Submitting.", (bash_call(submit),)),
        TeacherTurn("S5", "Done.", (_finish("Submitted."),)),
    ]
