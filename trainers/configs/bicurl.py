"""The BiCuRL run config and the evaluation config of its checkpoints; torch-free."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from bat_gym.core.errors import ConfigError
from bat_gym.core.spec import first_problem
from bat_gym.trainers.configs.base import PathText, RunConfig
from bat_gym.trainers.configs.evaluation import EvalRunConfig
from bat_gym.trainers.configs.grpo import GRPOConfig

__all__ = ["BiCuRLConfig"]


class BiCuRLConfig(RunConfig):
    """Settings of a BiCuRL run (:func:`bat_gym.trainers.bicurl.run_loop`)."""

    model: PathText
    """The starting checkpoint (typically after cold-start SFT)."""
    output_dir: PathText
    """The run directory: each round's GRPO block and evaluations, the loop state and the
    report; rerun into it to resume."""
    benchmark: str | None = None
    """Registered benchmark name (default: the installed default benchmark)."""
    bank: PathText | None = None
    """Stage Bank directory the rounds are drawn from (default: the benchmark's default)."""
    rounds: int = 10
    """Rounds (BaT: up to 10)."""
    steps_per_round: int = 50
    """GRPO steps per round (BaT: 50)."""
    eval_repeats: int | None = None
    """Held-out tasks per track in each evaluation (None: the benchmark's
    ``splits.heldout_repeats``, 10 for MedBench-Lite as in BaT)."""
    eval_tracks: tuple[str, ...] = ()
    """Tracks evaluated (empty: every track of the benchmark)."""
    eval_workers: int = 2
    """Evaluation episodes played at once, one sandbox each."""
    eval_max_turns: int | None = None
    """Turn budget of evaluation episodes (None: the benchmark's)."""
    eval_max_new_tokens: int | None = None
    """Tokens per turn in evaluation (None: the policy's default)."""
    eval_temperature: float | None = None
    """Sampling temperature in evaluation (None: the policy's default)."""
    eval_policy: Literal["hf", "vllm"] = "hf"
    """How each checkpoint is served in evaluation: ``hf`` (transformers) or ``vllm``."""
    selector: str = "paper"
    """Target selector: a name in :data:`bat_gym.curriculum.selection.SELECTORS` (``paper``: BaT's rule)."""
    thresholds: dict[str, Any] = Field(default_factory=dict)
    """Overrides of the promotion gate's thresholds (:class:`~bat_gym.curriculum.gate.GateThresholds`)."""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """Overrides of :class:`~bat_gym.trainers.configs.GRPOConfig` fields for every round."""
    kl_reference: Literal["incumbent", "start"] = "incumbent"
    """What each round's KL term pulls toward: the round's incumbent (the paper's "KL
    penalty toward the current policy") or the starting checkpoint (``model``, the
    cold-start SFT), which anchors every round to the same point."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Chat template arguments (e.g. ``{"enable_thinking": False}``) of every GRPO round
    and every evaluation, so candidates are trained and judged on the same rendering."""
    seed: int = 0
    """Base seed; round ``r``'s GRPO block gets
    :func:`~bat_gym.trainers.bicurl.round_seed` (seed, r)."""

    @property
    def evaluation(self) -> EvalRunConfig:
        """How each checkpoint is evaluated.

        The ``eval_*`` fields, with the loop's benchmark, chat template and seed.
        """
        return EvalRunConfig(
            benchmark=self.benchmark,
            repeats=self.eval_repeats,
            tracks=self.eval_tracks,
            workers=self.eval_workers,
            max_turns=self.eval_max_turns,
            max_new_tokens=self.eval_max_new_tokens,
            temperature=self.eval_temperature,
            chat_template_kwargs=self.chat_template_kwargs,
            seed=self.seed,
            policy=self.eval_policy,
        )

    def round_grpo(self, incumbent: str, target: str, output_dir: str, *, seed: int) -> GRPOConfig:
        """The GRPO block of one round: from ``incumbent``, a curriculum round on ``target``.

        Args:
            incumbent: the checkpoint the round starts from.
            target: the stage the round trains on.
            output_dir: the block's directory.
            seed: the round's GRPO seed (:func:`~bat_gym.trainers.bicurl.round_seed`).
        """
        settings: dict[str, Any] = {
            "model": incumbent,
            "output_dir": output_dir,
            "benchmark": self.benchmark,
            "bank": self.bank,
            "target": target,
            "steps": self.steps_per_round,
            "seed": seed,
            "kl_reference": self.model if self.kl_reference == "start" else None,
            "chat_template_kwargs": self.chat_template_kwargs,
        }
        return GRPOConfig(**{**settings, **self.grpo})  # an override wins

    @model_validator(mode="after")
    def _check(self) -> BiCuRLConfig:
        if (
            self.rounds < 1
            or self.steps_per_round < 1
            or (self.eval_repeats is not None and self.eval_repeats < 1)
        ):
            raise ConfigError("rounds, steps_per_round and eval_repeats must be >= 1")
        # Imported here: the gate brings the evaluation package (numpy), which reading
        # the config's fields for the command line does not need.
        from bat_gym.curriculum.gate import GateThresholds

        try:
            GateThresholds(**self.thresholds)  # fail now, not after the first GRPO block
        except ValidationError as exc:
            raise ConfigError(f"thresholds: {first_problem(exc)}") from exc
        # The GRPO overrides fail now, not after the starting evaluation. Any stage name
        # serves: GRPO reads the target only when its curriculum starts.
        try:
            self.round_grpo(self.model, "S1", self.output_dir, seed=self.seed)
        except ConfigError as exc:
            raise ConfigError(f"grpo: {exc}") from exc
        return self
