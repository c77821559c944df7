"""The scripted teacher and the naive baseline, built from a track's recipe.

Every track works through the same five stages with the same receipts; what differs is
the code that inspects the data, the pipeline, and the pilot's quality check. A track
supplies those as a :class:`Recipe` (code that runs inside the sandbox, read from the
track's files in :mod:`~bat_gym.envs.medbench_lite.scripts`) and :func:`teacher_turns`
splices them into the stage scripts of ``scripts/stages/`` to make its turns:

* S1: read TASK.md and the model card, then write ``plan/plan.md``.
* S2: record the environment and data compatibility, pin and smoke-test the model,
  write ``pipeline/infer.py``.
* S3: run the pipeline on one case and check the result against domain facts.
* S4: run every case; S5: write the submission in the task's schema; then finish.

Outcomes: ``success`` writes the correct pipeline in S2 and its pilot passes;
``recovery`` writes the pipeline with the track's realistic mistake, the S3 quality
check fails on it, and the next turn fixes the pipeline and reruns the pilot;
``failure`` keeps the mistake and validates with a shape-only check that cannot see it.

Rows cut after the mistake went in (the S3 rows of ``recovery`` and ``failure``, the S4
and S5 rows of ``failure``) start with the buggy pipeline in place. From such a row
the teacher plays a repair exercise (:func:`repair_turns`): the track's quality check
on the riskiest case shows the mistake, the pipeline is fixed in the open, the pilot
(and inference) run again, and the stage's receipt records each file the repair
changed (:mod:`bat_gym.core.repair_record`).
"""

from __future__ import annotations

from dataclasses import dataclass

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.protocol import ToolCall, bash_call, python_call
from bat_gym.core.repair_record import (
    STAGE_RECEIPTS,
    pipeline_reasons,
    record_stage_call,
    start_call,
    starts_with_s2_mistake,
)
from bat_gym.envs.medbench_lite.scripts import fragment, stage_script

__all__ = [
    "Recipe",
    "RECEIPT",
    "pilot_script",
    "teacher_turns",
    "naive_turns",
    "repair_turns",
    "carries_mistake",
    "python_call",
    "bash_call",
]

# The receipt helper every receipt-writing stage script begins with.
RECEIPT = fragment("stages", "receipt").strip()


@dataclass(frozen=True)
class Recipe:
    """A track's part of the teacher: code that runs in the sandbox, and what it says.

    Attributes:
        plan: text of the three plan sections (preprocess, inference, postprocess).
        inspect: python that opens every input and sets ``compat`` (a JSON-able dict).
        smoke: python that runs ``infer_lib`` (weights in ``W``) once on a tiny input
            and sets ``smoke`` (a JSON-able dict).
        pipeline: the correct ``pipeline/infer.py``.
        pipeline_bug: the same pipeline with the track's realistic mistake.
        naive_pipeline: what the naive baseline runs (the model's default convention).
        pilot: python that picks one case, runs ``infer.run`` on it into
            ``validation/pilot.csv`` and sets ``case_id`` and ``checks``
            (name -> {"value", "expect", "ok"}).
        weak_pilot: like ``pilot`` but checking only shapes and formats.
        out_dir: where full inference writes per-case outputs.
        submit_check: python that reads ``rows`` (the submission rows in case order)
            and appends what is wrong to ``problems``.
        says: the teacher's words per turn: keys ``inspect``, ``pipeline``,
            ``pipeline_bug`` (the same turn when the mistake goes in), ``pilot``,
            ``bug_seen`` (what the failed check means), ``fix``.
    """

    plan: tuple[str, str, str]
    inspect: str
    smoke: str
    pipeline: str
    pipeline_bug: str
    naive_pipeline: str
    pilot: str
    weak_pilot: str
    out_dir: str
    submit_check: str
    says: dict[str, str]


def _finish(summary: str) -> ToolCall:
    return ToolCall(name="finish", arguments={"summary": summary})


def _write_pipeline(source: str) -> ToolCall:
    # A heredoc keeps the pipeline readable in the transcript (no escaped string).
    return bash_call(
        "mkdir -p pipeline\ncat > pipeline/infer.py <<'PIPELINE_EOF'\n"
        + source.strip()
        + "\nPIPELINE_EOF\nwc -l pipeline/infer.py"
    )


def _plan_call(plan: tuple[str, str, str]) -> ToolCall:
    pre, inf, post = (p.strip() for p in plan)
    body = (
        "## Preprocess\n" + pre + "\n\n## Inference\n" + inf + "\n\n## Postprocess\n" + post + "\n"
    )
    # The number of cases is read from task.json, as an engineer counts them.
    count = "len(json.load(open('task.json'))['submission']['case_ids'])"
    return bash_call(
        f'mkdir -p plan\nn=$(python3 -c "import json; print({count})")\n'
        "{ printf '# Plan\\n\\n%s cases, listed in task.json.\\n\\n' \"$n\"\n"
        f"cat <<'PLAN_EOF'\n{body}PLAN_EOF\n}} > plan/plan.md\ngrep '^## ' plan/plan.md"
    )


def pilot_script(recipe: Recipe, weak: bool = False) -> str:
    """The S3 turn's python: the recipe's pilot and its checks, then the S3 receipt.

    Run in the workspace root with ``pipeline/infer.py`` in place, it exits non-zero
    (and writes no receipt) when a check fails.

    Args:
        recipe: the track's recipe.
        weak: the shape-only pilot (the failure outcome's) instead of the full one.
    """
    if weak:
        return stage_script(
            "s3_pilot",
            receipt=RECEIPT,
            pilot=recipe.weak_pilot,
            level="one-case pilot, shape check",
        )
    return stage_script(
        "s3_pilot", receipt=RECEIPT, pilot=recipe.pilot, level="one-case pilot + quality check"
    )


def teacher_turns(recipe: Recipe, outcome: str = "success") -> list[TeacherTurn]:
    """The careful engineer's turns for one task, stage by stage, ending in finish."""
    if outcome not in ("success", "recovery", "failure"):
        raise ValueError(f"outcome must be success, recovery or failure, got {outcome!r}")
    says = recipe.says
    first_pipeline = recipe.pipeline if outcome == "success" else recipe.pipeline_bug
    setup = stage_script("s2_setup", receipt=RECEIPT, inspect=recipe.inspect, smoke=recipe.smoke)
    full, weak = pilot_script(recipe), pilot_script(recipe, weak=True)
    turns = [
        TeacherTurn(
            "S1",
            "First I read the task description and the model card.",
            (bash_call("cat TASK.md"), bash_call("cat model/MODEL_CARD.md")),
        ),
        TeacherTurn(
            "S1", "Writing the plan with the three required sections.", (_plan_call(recipe.plan),)
        ),
        TeacherTurn("S2", says["inspect"], (python_call(setup),)),
        TeacherTurn(
            "S2",
            says["pipeline"] if outcome == "success" else says["pipeline_bug"],
            (_write_pipeline(first_pipeline),),
        ),
    ]
    if outcome == "failure":
        turns.append(
            TeacherTurn(
                "S3",
                "A one-case pilot to check that the pipeline runs and writes the expected output.",
                (python_call(weak),),
            )
        )
    else:
        turns.append(TeacherTurn("S3", says["pilot"], (python_call(full),)))
        if outcome == "recovery":
            turns.append(
                TeacherTurn(
                    "S3",
                    says["bug_seen"] + " " + says["fix"],
                    (_write_pipeline(recipe.pipeline), python_call(full)),
                )
            )
    turns += [
        TeacherTurn("S4", "The pilot is validated; running every case.", (_infer_call(recipe),)),
        TeacherTurn(
            "S5",
            "Writing the submission in the task's schema and checking it.",
            (_submit_call(recipe),),
        ),
        TeacherTurn(
            "S5",
            "All five stages are done.",
            (
                _finish(
                    "Planned, set up, validated on one case, ran all cases and submitted outputs/submission.csv."
                ),
            ),
        ),
    ]
    return turns


def _infer_call(recipe: Recipe) -> ToolCall:
    return python_call(stage_script("s4_infer", receipt=RECEIPT, out_dir=recipe.out_dir))


def _submit_call(recipe: Recipe) -> ToolCall:
    return python_call(stage_script("s5_submit", receipt=RECEIPT, check=recipe.submit_check))


_DISCARD_PILOT = bash_call("rm -rf validation/pilot.csv validation/pilot")


def carries_mistake(focus: str, outcome: str) -> bool:
    """Whether a row of ``outcome``'s trajectory at ``focus`` starts with the buggy pipeline.

    The S3 row of ``recovery`` and ``failure``, the S4 and S5 rows of ``failure``
    (:func:`~bat_gym.core.repair_record.starts_with_s2_mistake`).
    """
    return starts_with_s2_mistake(focus, outcome)


def repair_turns(recipe: Recipe, focus: str, outcome: str) -> list[TeacherTurn]:
    """The teacher's turns for stage ``focus`` from a row that starts with the buggy pipeline.

    ``[]`` for a row that does not (:func:`carries_mistake`). Otherwise: keep the start
    state's sha256s, run the track's quality check on its riskiest case (it fails: the
    evidence), write the correct pipeline and pilot again, in S4 and S5 run every case
    again (and submit), then record every earlier file the repair changed in the
    stage's receipt.

    Args:
        recipe: the track's recipe.
        focus: the row's stage, ``S1``..``S5``.
        outcome: the outcome of the trajectory the row was cut from.
    """
    if not carries_mistake(focus, outcome):
        return []
    says, full = recipe.says, pilot_script(recipe)
    look = (
        says["pilot"]
        if focus == "S3"
        else "The S3 receipt records only a shape check, which cannot see a wrong "
        "convention; before going on I run the track's quality check. " + says["pilot"]
    )
    turns = [
        TeacherTurn(focus, look, (start_call(), python_call(full))),
        TeacherTurn(
            focus,
            says["bug_seen"] + " " + says["fix"],
            # The failed pilot's outputs go first, so the new pilot writes every file.
            (_DISCARD_PILOT, _write_pipeline(recipe.pipeline), python_call(full)),
        ),
    ]
    if focus in ("S4", "S5"):
        turns.append(
            TeacherTurn(
                focus,
                "The repaired pilot passes; running every case again.",
                (_infer_call(recipe),),
            )
        )
    if focus == "S5":
        turns.append(
            TeacherTurn(
                focus,
                "Writing the submission in the task's schema and checking it.",
                (_submit_call(recipe),),
            )
        )
    evidence = "the S3 quality check failed on the pilot case: " + says["bug_seen"]
    turns.append(
        TeacherTurn(
            focus,
            f"Recording the repair in {STAGE_RECEIPTS[focus][0]}: each earlier file it changed, "
            "with its sha256 before and after.",
            (record_stage_call(focus, pipeline_reasons(evidence)),),
        )
    )
    return turns


def naive_turns(recipe: Recipe) -> list[TeacherTurn]:
    """The naive baseline: no validation; the model's output as it comes, submitted."""
    return [
        TeacherTurn(
            "S2",
            "Writing an inference script that calls the model.",
            (_write_pipeline(recipe.naive_pipeline),),
        ),
        TeacherTurn(
            "S4",
            "Running it on every case.",
            (python_call(stage_script("naive_s4_infer", out_dir=recipe.out_dir)),),
        ),
        TeacherTurn(
            "S5",
            "Submitting the predictions.",
            (python_call(stage_script("naive_s5_submit", receipt=RECEIPT)),),
        ),
        TeacherTurn("S5", "Done.", (_finish("Submitted the model's outputs."),)),
    ]
