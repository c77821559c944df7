"""Run configs, one per concern: GRPO, cold-start SFT, BiCuRL and evaluation.

Pydantic models that import no torch, so ``bat-gym --help`` and the command line's
options (:mod:`bat_gym.trainers.config_options`, one option per field) read them
directly. Each field's help is the docstring under it; a bad value raises
:class:`~bat_gym.core.errors.ConfigError` naming the field and the fix.
"""

from __future__ import annotations

from bat_gym.trainers.configs.base import Aggregation, Precision, RunConfig, Schedule
from bat_gym.trainers.configs.bicurl import BiCuRLConfig
from bat_gym.trainers.configs.evaluation import EvalRunConfig
from bat_gym.trainers.configs.grpo import GRPOConfig
from bat_gym.trainers.configs.sft import SFTConfig

__all__ = [
    # the run configs
    "BiCuRLConfig",
    "EvalRunConfig",
    "GRPOConfig",
    "SFTConfig",
    # what they share
    "Aggregation",
    "Precision",
    "RunConfig",
    "Schedule",
]
