"""The study config: which arms, how many seeds, what budget; read from a YAML file.

Torch-free, like the run configs (:mod:`bat_gym.trainers.configs`): loading and
checking a study file imports pydantic and YAML only. A study file holds the full
sizes at its top level and the ``--quick`` sizes under ``quick:`` (fields that
override the top level)::

    name: skill_ladder
    benchmark: skill_ladder
    seeds: 5
    token_budget: 60000
    quick: {seeds: 2, token_budget: 6000}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from bat_gym.core.errors import ConfigError
from bat_gym.trainers.configs.base import RunConfig

__all__ = ["ARM_NAMES", "ArmName", "StudyConfig", "load_study"]

ArmName = Literal[
    "baseline",
    "sft",
    "grpo-e2e",
    "bicurl",
    "bicurl-no-target",
    "bicurl-no-mix",
    "bicurl-no-e2e",
]
"""The paper's comparison (see :mod:`bat_gym.trainers.study.arms`)."""

ARM_NAMES: tuple[str, ...] = ArmName.__args__  # type: ignore[attr-defined]

# GRPO fields each arm gets from the study (the shared SFT start, the arm's pools, the
# token budget, the seed); an override in ``grpo:`` would break the comparison.
_STUDY_OWNED = frozenset(
    {"model", "output_dir", "benchmark", "bank", "target", "curriculum", "seed", "steps",
     "max_generated_tokens", "groups_per_step", "group_size", "max_new_tokens",
     "max_turns", "temperature"}
)  # fmt: skip


# SFT fields the study sets for the shared SFT run.
_SFT_OWNED = frozenset({"model", "data_dir", "output_dir", "max_steps"})


class StudyConfig(RunConfig):
    """Settings of one study: the arms, their seeds, their shared budget and evaluation."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """The study's name (the default output folder is ``runs/study-<name>``)."""
    benchmark: str = "skill_ladder"
    """Registered benchmark the arms train and are evaluated on."""
    arms: tuple[ArmName, ...] = ARM_NAMES
    """Arms to run, in this order (default: all seven)."""
    seeds: int = Field(5, ge=1)
    """Seeds per arm (0 .. seeds-1): the RL arms' training seed, and every arm's
    evaluation sampling seed."""
    tasks_per_track: int = Field(8, ge=1)
    """Training tasks per track in the Stage Bank (success and recovery trajectories)."""
    sft_steps: int = Field(300, ge=1)
    """Cold-start SFT steps of the shared SFT checkpoint every RL arm starts from."""
    token_budget: int = Field(ge=1)
    """Generated (sampled response) tokens per RL arm and seed, every round together;
    tool results are not counted. A run stops within one GRPO step above it."""
    groups_per_step: int = Field(8, ge=2)
    """States per GRPO step, split over the pools by the arm's mix (BaT: 8)."""
    group_size: int = Field(4, ge=2)
    """Rollouts per state (BaT: 4)."""
    rounds: int = Field(10, ge=1)
    """BiCuRL rounds; each gets ``token_budget / rounds`` tokens."""
    max_steps_per_round: int = Field(1000, ge=1)
    """Safety cap on GRPO steps per round (the token budget ends a round first)."""
    selector: str = "deficit"
    """BiCuRL's target selector (``paper``: the lowest stage; ``deficit``: the largest
    weighted shortfall)."""
    eval_repeats: int = Field(16, ge=1)
    """Held-out tasks per track in each arm's final evaluation."""
    round_eval_repeats: int | None = Field(None, ge=1)
    """Held-out tasks per track in BiCuRL's per-round gate evaluations (None:
    ``eval_repeats``)."""
    eval_workers: int = Field(6, ge=1)
    """Evaluation episodes played (and decoded) at once."""
    max_turns: int = Field(8, ge=1)
    """Turn budget of every episode, in training and evaluation alike."""
    max_new_tokens: int = Field(96, ge=1)
    """Tokens per sampled turn."""
    temperature: float = Field(0.7, gt=0)
    """Sampling temperature in training and evaluation (BaT: 0.7)."""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """Overrides of :class:`~bat_gym.trainers.configs.GRPOConfig` fields for every RL
    arm (``lr``, ``warmup_steps``, ``kl_coef``, ``generator: vllm``, ``device``, ...)."""
    base_model: str | None = None
    """A Hugging Face checkpoint (a local folder) the shared SFT run starts from, with its
    own tokenizer. None: the tiny random-init model built from the bank (CPU sizes)."""
    sft: dict[str, Any] = Field(default_factory=dict)
    """Overrides of :class:`~bat_gym.trainers.configs.SFTConfig` fields for the shared
    SFT run (``lr``, ``micro_batch_size``, ``device``, ...)."""
    eval_policy: Literal["hf", "vllm"] = "hf"
    """How checkpoints are served in evaluation: ``hf`` (transformers) or ``vllm``
    (vLLM's offline engine, on a GPU)."""
    quick: dict[str, Any] = Field(default_factory=dict)
    """Fields that ``--quick`` overrides (smaller everything)."""

    @property
    def seed_list(self) -> list[int]:
        """The seeds, 0 first."""
        return list(range(self.seeds))

    @property
    def round_tokens(self) -> int:
        """Each BiCuRL round's share of the token budget (at least 1)."""
        return max(1, self.token_budget // self.rounds)

    def check_base_model(self) -> None:
        """Refuse, before any work, a ``base_model`` that is not a checkpoint folder.

        Raises:
            ConfigError: naming the folder and what to give.
        """
        if self.base_model is not None and not (Path(self.base_model) / "config.json").is_file():
            raise ConfigError(
                f"base_model {self.base_model} is not a Hugging Face checkpoint folder (no "
                "config.json): give a local folder saved with save_pretrained (--base-model "
                "PATH); nothing is downloaded"
            )

    @model_validator(mode="after")
    def _check(self) -> StudyConfig:
        if len(set(self.arms)) != len(self.arms):
            raise ConfigError(f"arms lists an arm twice: {list(self.arms)}; name each arm once")
        if "quick" in self.quick:
            raise ConfigError("quick: a quick size cannot hold its own quick: block; remove it")
        owned = sorted(set(self.grpo) & _STUDY_OWNED)
        if owned:
            raise ConfigError(
                f"grpo: {', '.join(owned)} are set by the study for each arm (the shared SFT "
                "start, the arm's pools, the token budget); remove them from grpo:"
            )
        owned = sorted(set(self.sft) & _SFT_OWNED)
        if owned:
            raise ConfigError(
                f"sft: {', '.join(owned)} are set by the study (base_model, its SFT data, "
                "sft_steps, the unit's folder); remove them from sft:"
            )
        return self


def load_study(path: str | Path, *, quick: bool = False) -> StudyConfig:
    """Read a study file; with ``quick``, its ``quick:`` fields override the rest.

    Raises:
        ConfigError: the file is missing, is not YAML, or a field is wrong (naming it).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"study file {path} does not exist; give a YAML file such as "
            "benchmarks/studies/skill_ladder.yaml"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML ({exc}); fix the line it names") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of study fields, got {type(data).__name__}")
    if quick:
        data = {**data, **(data.get("quick") or {})}
    try:
        return StudyConfig(**data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
