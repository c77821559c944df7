"""What every run config shares: strict pydantic, field docstrings as help, one error type.

A config imports pydantic and the core vocabulary only, never torch, so the command line
reads its fields (names, defaults, help) by importing it
(:mod:`bat_gym.trainers.config_options`).
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from bat_gym.core.errors import ConfigError
from bat_gym.core.spec import first_problem

__all__ = ["Aggregation", "PathText", "Precision", "RunConfig", "Schedule"]


def _fspath(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


PathText = Annotated[str, BeforeValidator(_fspath)]
"""A directory or file, kept as text (a :class:`~pathlib.Path` is accepted)."""

Schedule = Literal["constant", "linear", "cosine"]
"""The learning rate after warmup: kept, decayed linearly, or along a half cosine."""

Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
"""How GRPO's token losses become the batch loss (see :func:`~bat_gym.trainers.grpo_loss.grpo_loss`)."""

Precision = Literal["auto", "on", "off"]
"""bf16 autocast: ``auto`` (CUDA devices with bf16 support), ``on`` or ``off``."""


class RunConfig(BaseModel):
    """Base of the run configs: unknown fields and bad values raise :class:`ConfigError`.

    Each field's help is the docstring under it (``use_attribute_docstrings``), so the
    help lives once, beside the field.
    """

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(type(self).__name__, exc) from exc


def config_error(name: str, exc: ValidationError) -> ConfigError:
    """The config's own :class:`ConfigError` where a check raised one, else the first problem.

    Pydantic wraps a ``ValueError`` raised by a validator; the checks' own messages name
    the fix, so they are handed on as they were written.
    """
    first = exc.errors()[0]
    raised = (first.get("ctx") or {}).get("error")
    if isinstance(raised, ConfigError):
        return raised
    return ConfigError(f"{name}: {first_problem(exc)}")
