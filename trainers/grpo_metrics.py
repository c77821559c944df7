"""The metrics of one GRPO step: a line of ``metrics.jsonl``, checked when written and read.

Each optimizer step writes one :class:`StepMetrics` as a JSON line (the keys it has
always had) and hands the same record to ``on_step``. The fields here are the ones the
trainer writes today; a metric added later travels with the record (``extra``) until it
gets a field of its own.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bat_gym.core.errors import BatGymError
from bat_gym.core.spec import first_problem

__all__ = ["StepMetrics", "no_signal_hint", "read_metrics", "warn_without_signal"]

log = logging.getLogger(__name__)


class StepMetrics(BaseModel):
    """One GRPO step: its rollouts (means over every rank's), its update, its timing."""

    model_config = ConfigDict(extra="allow", frozen=True)

    step: int = Field(ge=1, description="The optimizer step, 1 first.")
    # ---- rollouts
    reward: float = Field(description="Mean rollout reward (a null verdict counts as 0).")
    reward_by_pool: dict[str, float] = Field(description="Mean rollout reward per state pool.")
    scored_rollouts: int = Field(ge=0, description="Rollouts with a verdict (in the loss).")
    zero_advantage_groups: float = Field(
        ge=0, le=1, description="Share of groups whose rewards are all equal (no gradient)."
    )
    response_tokens: float = Field(ge=0, description="Mean response tokens per rollout.")
    generated_tokens: float = Field(
        0.0, ge=0, description="Response tokens the step sampled, every rollout together."
    )
    turns: float = Field(ge=0, description="Mean assistant turns per rollout.")
    finished: float = Field(ge=0, le=1, description="Share of rollouts that called finish.")
    finished_by_pool: dict[str, float] = Field(
        default_factory=dict,
        description="Share of rollouts that called finish, per state pool ({} in runs "
        "written before it was logged).",
    )
    length_cut: float = Field(ge=0, le=1, description="Share of rollouts a token limit ended.")
    budget_cut: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of rollouts an env budget (turns, tool calls, response tokens) "
        "ended before finish (0 in runs written before it was logged).",
    )
    rerendered_replies: float = Field(
        ge=0, description="Mean replies after a turn the chat template re-renders."
    )
    # ---- update
    lr: float = Field(ge=0, description="Learning rate of the step.")
    sampler_logprob_gap: float = Field(
        ge=0, description="Mean |sampler - trainer| log-prob of the sampled tokens, nats."
    )
    sampler_gap_alarm: float = Field(description="1.0 when the gap passed its alarm, else 0.0.")
    tis_weight_mean: float = Field(description="Mean truncated importance weight (1: none).")
    tis_truncated_fraction: float = Field(ge=0, le=1, description="Share of weights capped.")
    loss: float = Field(description="Mean loss over the step's updates.")
    kl: float = Field(description="Mean k3 KL to the reference per token.")
    clip_fraction: float = Field(ge=0, le=1, description="Share of tokens the ratio clip hit.")
    entropy: float = Field(description="Mean policy entropy per token, nats.")
    grad_norm: float = Field(ge=0, description="Global gradient norm before clipping.")
    # ---- timing
    rollout_s: float = Field(ge=0, description="Seconds of the step's rollouts.")
    update_s: float = Field(ge=0, description="Seconds of the step's update.")


def read_metrics(path: str | Path) -> list[StepMetrics]:
    """The steps of a GRPO run's ``metrics.jsonl``, in order.

    Raises:
        BatGymError: a line is not a step's metrics (naming the line and the field).
    """
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            out.append(StepMetrics.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise BatGymError(f"{path}:{n}: not JSON ({exc.msg}); the line is torn") from exc
        except ValidationError as exc:
            raise BatGymError(
                f"{path}:{n}: not a GRPO step's metrics: {first_problem(exc)}"
            ) from exc
    return out


def no_signal_hint(metrics: StepMetrics | dict[str, Any]) -> str | None:
    """One line on why a step taught nothing, and what to change; None when it taught.

    A step teaches nothing when every group's rollouts earned the same reward (zero
    advantage everywhere): that is what a model whose every turn a token limit cuts (every
    reward less the same penalty, or masked), or one that never earns credit, produces.
    """
    m = metrics if isinstance(metrics, StepMetrics) else StepMetrics.model_validate(metrics)
    if m.zero_advantage_groups < 1.0:
        return None
    if m.length_cut >= 1.0:
        why = (
            "a token limit cut every episode (cut 1.00): raise --max-new-tokens, SFT the "
            "model until it ends its turns"
        )
    elif m.reward == 0.0:
        why = "no rollout earned credit: SFT the model first, or --target an easier stage"
    else:
        why = "every group's rollouts scored alike: raise --group-size or --temperature"
    return (
        f"GRPO step {m.step}: no learning signal (zero-adv groups 1.00, reward "
        f"{m.reward:.3f}): {why}"
    )


def warn_without_signal(metrics: StepMetrics | dict[str, Any]) -> None:
    """Log :func:`no_signal_hint`'s line as a warning when the step taught nothing."""
    hint = no_signal_hint(metrics)
    if hint is not None:
        log.warning(hint)
