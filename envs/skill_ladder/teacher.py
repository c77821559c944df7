"""skill_ladder's scripted teacher and naive baseline: one short bash command per turn.

The success path is six or seven turns: plan, setup, (the code check,) the pilot with
the right flag, inference, submission, finish. ``recovery`` pilots with the track's
typical mistake first, reads ``CHECK FAILED`` and pilots again with the right flag;
``failure`` makes the same mistake and carries it through to the submission. The
naive baseline installs the pipeline and runs it on every case with its defaults: no
plan and no pilot, so nothing is validated and no flag is chosen.

A ``failure`` trajectory's S4 and S5 rows start with its mistaken pilot in place (the
wrong flag in ``validation/settings.json``, which inference reuses). From such a row
the teacher plays a repair exercise (:func:`repair_turns`): it reads the pilot's
failed check, pilots again with the right flag, re-runs what depends on the settings,
and records the repair in its stage's receipt.
"""

from __future__ import annotations

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.protocol import ToolCall
from bat_gym.core.repair_record import record_call, start_call
from bat_gym.envs.skill_ladder.tasks import Draw

__all__ = [
    "OUTCOMES",
    "teacher_turns",
    "naive_turns",
    "repair_turns",
    "mistaken_flag",
    "right_flag",
    "sh",
]

OUTCOMES = ("success", "recovery", "failure")
PILOT = "python pipeline/infer.py validation/pilot.csv"


def sh(command: str) -> ToolCall:
    """An execute_code call running one bash command."""
    return ToolCall(name="execute_code", arguments={"language": "bash", "code": command})


def right_flag(d: Draw) -> str:
    """The pilot flag the task needs."""
    name = {"units": "--unit", "cases": "--case", "codes": "--codes"}[d.track]
    return f"{name} {d.choice}"


def mistaken_flag(d: Draw) -> str:
    """The track's typical mistake: the other unit, the default case, the default codes."""
    if d.track == "units":
        return "--unit " + ("cm" if d.choice == "mm" else "mm")
    return ""  # cases and codes: no flag, so the first case and the raw codes are used


def _pilot(flag: str) -> ToolCall:
    return sh(f"{PILOT} {flag}".rstrip())


def _why(d: Draw) -> str:
    """The teacher's one-line reason for its flag, naming where the value comes from."""
    return {
        "units": f"The sizes are in {d.choice}.",
        "cases": f"The phantom is {d.choice}.",
        "codes": f"The check says --codes {d.choice}.",
    }[d.track]


def _validate(d: Draw, outcome: str) -> list[TeacherTurn]:
    if outcome != "success":
        turns = [TeacherTurn("S3", "Pilot one case.", (_pilot(mistaken_flag(d)),))]
        if outcome == "recovery":
            turns.append(TeacherTurn("S3", f"CHECK FAILED. {_why(d)}", (_pilot(right_flag(d)),)))
        return turns
    turns = []
    if d.track == "codes":
        turns.append(TeacherTurn("S3", "Check the codes.", (sh("python pipeline/infer.py check"),)))
    turns.append(TeacherTurn("S3", _why(d), (_pilot(right_flag(d)),)))
    return turns


def teacher_turns(d: Draw, outcome: str = "success") -> list[TeacherTurn]:
    """The teacher's turns for the task ``d``, stage by stage, ending in finish.

    Args:
        d: the task's draw.
        outcome: ``success``; ``recovery`` (the mistaken pilot, its failed check, the
            right pilot); ``failure`` (the mistaken pilot, kept).

    Raises:
        ValueError: an unknown outcome.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    return [
        TeacherTurn("S1", "Plan.", (sh("python tool/pipe.py plan"),)),
        TeacherTurn("S2", "Setup.", (sh("python tool/pipe.py setup"),)),
        *_validate(d, outcome),
        TeacherTurn(
            "S4", "Run every case.", (sh("python pipeline/infer.py outputs/predictions.csv"),)
        ),
        TeacherTurn("S5", "Submit.", (sh("python pipeline/infer.py outputs/submission.csv"),)),
        TeacherTurn("S5", "Done.", (ToolCall(name="finish", arguments={"summary": "Submitted."}),)),
    ]


def repair_turns(d: Draw, focus: str, outcome: str) -> list[TeacherTurn]:
    """The teacher's turns for stage ``focus`` from a row whose start carries the S3 mistake.

    Only a ``failure`` trajectory's S4 and S5 rows do (its pilot ran with the mistaken
    flag, and inference reads the pilot's settings); for any other row: ``[]``. The
    turns read the failed check in the S3 receipt, pilot again with the right flag,
    run every case (and, in S5, submit), then write the ``repairs`` record into the
    stage's receipt (:mod:`bat_gym.core.repair_record`).

    Args:
        d: the task's draw.
        focus: the row's stage, ``S1``..``S5``.
        outcome: the outcome of the trajectory the row was cut from.
    """
    if outcome != "failure" or focus not in ("S4", "S5"):
        return []
    wrong = mistaken_flag(d) or "the default flags"
    reasons = [
        (
            "validation/",
            f"the S3 pilot ran with {wrong} and its check failed (CHECK FAILED in "
            f"validation/s3_validation.json); piloted again with {right_flag(d)}",
        ),
        ("outputs/", f"re-derived with the repaired pilot settings ({right_flag(d)})"),
    ]
    turns = [
        TeacherTurn(
            focus,
            "Before going on I read what the pilot left: its receipt and the settings "
            "every later run reuses.",
            (start_call(), sh("cat validation/s3_validation.json validation/settings.json")),
        ),
        TeacherTurn(
            focus,
            f"The pilot's check failed and its settings hold {wrong}: every prediction "
            f"would inherit the mistake. {_why(d)} Piloting again with {right_flag(d)}.",
            (_pilot(right_flag(d)),),
        ),
        TeacherTurn(
            focus,
            "The pilot passes now; running every case with its settings.",
            (sh("python pipeline/infer.py outputs/predictions.csv"),),
        ),
    ]
    if focus == "S4":
        receipt, own = (
            "validation/s4_completion.json",
            ("outputs/", "validation/s4_completion.json"),
        )
    else:
        turns.append(
            TeacherTurn("S5", "Submit.", (sh("python pipeline/infer.py outputs/submission.csv"),))
        )
        receipt, own = (
            "validation/s5_submission.json",
            ("outputs/submission.csv", "validation/s5_submission.json"),
        )
    turns.append(
        TeacherTurn(
            focus,
            f"Recording the repair in {receipt}: each earlier file it changed, with its "
            "sha256 before and after.",
            (record_call(receipt, reasons, own),),
        )
    )
    return turns


def naive_turns(d: Draw) -> list[TeacherTurn]:
    """The naive baseline: the pipeline on every case with its default flags, unvalidated."""
    return [
        TeacherTurn("S2", "Setup.", (sh("python tool/pipe.py setup"),)),
        TeacherTurn(
            "S4", "Run every case.", (sh("python pipeline/infer.py outputs/predictions.csv"),)
        ),
        TeacherTurn("S5", "Submit.", (sh("python pipeline/infer.py outputs/submission.csv"),)),
        TeacherTurn("S5", "Done.", (ToolCall(name="finish", arguments={"summary": "Submitted."}),)),
    ]
