"""One evaluated cell: a (track, seed, repeat) E2E episode and everything it produced.

Cells live on the evaluation side of the firewall: they name tasks, hold the verdict
and the episode's notes. Training never reads them; it reads
:class:`~bat_gym.evaluation.aggregates.Aggregates`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Cell", "CellResult", "FailureCategory", "FAILURE_CATEGORIES"]

#: Why a scored run fell short, as a closed set: the only failure information that may
#: cross the firewall (as counts).
FailureCategory = Literal[
    "turn_budget",  # ran out of assistant turns before finish
    "tool_call_budget",  # ran out of tool calls
    "token_budget",  # ran out of response tokens
    "malformed_calls",  # at least half the turns held no readable tool call
    "no_successful_change",  # the reward gate: no tool call succeeded and changed the workspace
    "task_zero",  # task score 0: no submission, a malformed one, or a wrong one
    "low_task_score",  # task score above 0 and below 0.5
    "stage_incomplete",  # some stage's credit below 1
    "unsafe_workspace",  # the agent left what the host must not follow or store: scored 0
    "quota_exceeded",  # the agent's workspace outgrew its byte or file quota: scored 0
    "infrastructure",  # sandbox crash or policy/server failure: the cell is invalid
]
FAILURE_CATEGORIES: tuple[str, ...] = FailureCategory.__args__  # type: ignore[attr-defined]


class Cell(BaseModel):
    """Which episode to play: a held-out task of a track, and the repeat number."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    track: str
    seed: int
    repeat: int = Field(ge=0)

    @property
    def key(self) -> str:
        """A stable file-name-safe key, e.g. ``segmentation-1000007-r0``."""
        return f"{self.track}-{self.seed}-r{self.repeat}"

    @property
    def seed_key(self) -> tuple[str | int, ...]:
        """Names the cell's episode to a seeded policy (:func:`bat_gym.policies.keyed_seed`).

        The cell's turns then sample the same tokens however the workers interleave
        and whether or not the run was resumed.
        """
        return ("cell", self.track, self.seed, self.repeat)


class CellResult(BaseModel):
    """The outcome of one cell's episode (evaluation side only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cell: Cell
    task_id: str
    tier: str | None = Field(
        None,
        description=(
            'The task\'s difficulty tier: its params["difficulty"] where the benchmark '
            "draws tiers (MedBench-Lite: easy, hard), else None. Aggregated per tier."
        ),
    )
    valid: bool = Field(
        description="False: infrastructure failed; never scored as a model failure."
    )
    error: str | None = Field(None, description="Why the cell is invalid, for the report.")
    attempts: int = Field(1, ge=1)
    overall: float | None = Field(None, ge=0, le=1)
    task: float | None = Field(None, ge=0, le=1)
    agentic: float | None = Field(None, ge=0, le=1)
    reward: float | None = Field(None, ge=0, le=1)
    stages: dict[str, float | None] = Field(default_factory=dict, description="Stage credits.")
    finished: bool = Field(False, description="The policy called finish.")
    turns: int = 0
    tool_calls: int = 0
    response_tokens: int = 0
    failures: tuple[FailureCategory, ...] = ()
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0
