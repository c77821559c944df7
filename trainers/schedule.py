"""Learning-rate schedules shared by the trainers: linear warmup, then a decay shape."""

from __future__ import annotations

import math
from functools import partial

import torch

from bat_gym.trainers.configs import Schedule

__all__ = ["lr_factor", "lr_scheduler"]


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, schedule: str) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based).

    Warmup: ``(step + 1) / warmup_steps`` while ``step < warmup_steps``; then, with
    ``p = (step - warmup) / (max_steps - warmup)``: constant 1, linear ``1 - p``, or
    cosine ``0.5 * (1 + cos(pi * p))``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or max_steps <= warmup_steps:
        return 1.0
    p = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
    return 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))


def lr_scheduler(
    opt: torch.optim.Optimizer, *, warmup_steps: int, max_steps: int, schedule: Schedule
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler applying :func:`lr_factor`; step it once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt,
        partial(lr_factor, warmup_steps=warmup_steps, max_steps=max_steps, schedule=schedule),
    )
