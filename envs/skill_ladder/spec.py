"""The skill_ladder spec: five stages with one-command skills, three tracks, small budgets."""

from __future__ import annotations

from bat_gym.core.spec import BenchmarkSpec, Budgets, SeedRange, Splits, Track
from bat_gym.core.stages import reference_stages

__all__ = ["SPEC", "SKILLS", "TRACKS"]

TRACKS = ("units", "cases", "codes")

# Each skill names the exact command: what is learned is which command, and which flag
# value to copy from the task card or from the tool's own output.
SKILLS = {
    "S1": "python tool/pipe.py plan",
    "S2": "python tool/pipe.py setup",
    "S3": (
        "python pipeline/infer.py validation/pilot.csv FLAG, where FLAG is --unit U (the unit "
        "TASK.md states), --case ID (the phantom TASK.md names) or --codes FIX (the fix "
        "`python pipeline/infer.py check` prints). On CHECK FAILED, fix FLAG and rerun."
    ),
    "S4": "python pipeline/infer.py outputs/predictions.csv",
    "S5": "python pipeline/infer.py outputs/submission.csv",
}

SPEC = BenchmarkSpec(
    name="skill_ladder",
    version="1.1",
    description=(
        "Five stages, each one short command of a shipped tool; per task one flag to copy "
        "from the card (unit, phantom id) or from the tool's check (code fix)."
    ),
    stages=reference_stages(
        SKILLS,
        # The pilot also records the flag it was run with.
        artifacts={
            "S3": (
                "validation/pilot.csv",
                "validation/s3_validation.json",
                "validation/settings.json",
            )
        },
    ),
    tracks=(
        Track(
            name="units",
            metric="accuracy",
            description="Threshold sizes recorded in the unit the card states (--unit).",
        ),
        Track(
            name="cases",
            metric="accuracy",
            description="Threshold sizes after calibrating on the phantom the card names (--case).",
        ),
        Track(
            name="codes",
            metric="accuracy",
            description="Look codes up after the fix the tool's check names (--codes).",
        ),
    ),
    # Small budgets: the teacher needs at most 7 turns, and tiny policies train on
    # short episodes.
    budgets=Budgets(
        max_turns=12,
        max_tool_calls=12,
        max_response_tokens=4096,
        max_observation_chars=1024,
        tool_timeout_s=30.0,
        max_prompt_chars=4096,
    ),
    # 48 held-out tasks per track: the learnability evaluations need that many for their
    # confidence intervals, and the leakage audit covers every task an evaluation plays.
    splits=Splits(
        train=SeedRange(start=0, stop=10_000),
        heldout=SeedRange(start=1_000_000, stop=1_000_100),
        heldout_repeats=48,
    ),
)
