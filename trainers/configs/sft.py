"""The cold-start SFT run config: torch-free, so the command line reads its fields."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from bat_gym.core.errors import ConfigError
from bat_gym.trainers.configs.base import PathText, Precision, RunConfig, Schedule

__all__ = ["SFTConfig"]


class SFTConfig(RunConfig):
    """Everything a cold-start SFT run (:func:`bat_gym.trainers.sft.train`) depends on."""

    model: PathText
    """Model directory (or hub id) for ``AutoModelForCausalLM``/``AutoTokenizer``."""
    data_dir: PathText | None = None
    """The :func:`~bat_gym.sft.export_sft` output (``train.jsonl``, ``validation.jsonl``).
    ``None`` when the rows are passed to :func:`train` directly."""
    chat_template_kwargs: dict[str, Any] | None = None
    """The chat template arguments the rows in ``data_dir`` were rendered with (e.g.
    ``{"enable_thinking": False}``); when set, :func:`train` checks that
    ``data_dir/manifest.json`` (written by :func:`~bat_gym.sft.export_sft`) records the
    same, so the model is not fine-tuned on another rendering than GRPO and evaluation
    use. None: no check."""
    output_dir: PathText = "runs/sft"
    """Checkpoints (``checkpoints/step-XXXXXXXX``), ``metrics.jsonl``, ``summary.json``
    and the exported model (``final``)."""
    lr: float = 2e-5
    """Peak learning rate; 2e-5 is the BaT cold-start value for 4B-9B models. Tiny
    models for tests learn with 1e-3."""
    adam_beta1: float = 0.9
    """AdamW first-moment decay."""
    adam_beta2: float = 0.999
    """AdamW second-moment decay (0.95 is common for long pretraining runs; a 200-step
    fine-tune sees too few steps for the difference to matter)."""
    adam_eps: float = 1e-8
    """AdamW denominator epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay, applied to matrices only (never to norms or biases)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still logged)."""
    micro_batch_size: int = 1
    """Rows per forward pass (memory knob; does not change the math)."""
    grad_accum_steps: int = 32
    """Micro-batches per optimizer step; the global batch is their product (BaT: 32 rows)."""
    max_steps: int = 200
    """Optimizer steps of the whole run (BaT: 200). Epochs follow from the data size."""
    warmup_steps: int = 10
    """Linear warmup from 0 to ``lr`` over this many steps; 0 starts at ``lr``."""
    lr_schedule: Schedule = "cosine"
    """After warmup: keep ``lr``, or decay it linearly or along a half cosine to 0 at
    ``max_steps``. The paper does not name one; cosine is the common choice."""
    bf16: Precision = "auto"
    """bf16 autocast (weights and optimizer stay fp32). ``auto``: on for CUDA devices
    with bf16 support, off elsewhere (CPU autocast is slow and lossy); ``on`` forces it."""
    eval_every: int = 50
    """Validation loss (mean NLL over target tokens) every this many steps and at the
    end; 0 evaluates only at the end. Skipped without validation rows."""
    save_every: int = 50
    """Checkpoint every this many steps; 0 saves only when the call stops early. The last
    step always leaves a checkpoint, so a finished run can be extended."""
    keep_last: int = 2
    """Checkpoints kept on disk; older ones are deleted after a newer one is complete."""
    log_every: int = 10
    """Log a training line every this many steps (metrics.jsonl gets every step)."""
    seed: int = 0
    """Seeds the data order (a fresh permutation per epoch) and the RNGs."""
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU) or a torch device string such as ``cuda:1``."""
    resume: bool = True
    """Continue from the newest checkpoint in ``output_dir`` when there is one. False
    refuses to start over an output directory that already holds checkpoints."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third slower)."""
    mlp_chunk_size: int | None = 1024
    """Tokens per tile of each decoder layer's MLP in training
    (:mod:`~bat_gym.trainers.tiled_mlp`): the MLP intermediates, the largest activations
    of a layer at long sequences, are formed one tile at a time. The same loss and
    gradients for one more MLP forward per step; no effect on micro-batches of fewer
    tokens. None: untiled."""

    @model_validator(mode="after")
    def _check(self) -> SFTConfig:
        # Catch impossible values before a model is loaded; each message names the fix.
        positive = ("lr", "micro_batch_size", "grad_accum_steps", "max_steps", "keep_last")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("eval_every", "save_every", "log_every", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 disables), got {getattr(self, name)}")
        if self.mlp_chunk_size is not None and self.mlp_chunk_size < 1:
            raise ConfigError(
                f"mlp_chunk_size must be >= 1 token, or None for untiled MLPs, got "
                f"{self.mlp_chunk_size}"
            )
        if not 0 <= self.adam_beta1 < 1 or not 0 <= self.adam_beta2 < 1:
            raise ConfigError(
                f"AdamW betas must lie in [0, 1), got ({self.adam_beta1}, {self.adam_beta2})"
            )
        # Warmup must end by the last step, or the run never reaches the peak lr.
        if not 0 <= self.warmup_steps <= self.max_steps:
            raise ConfigError(
                f"warmup_steps must be in [0, max_steps={self.max_steps}], got {self.warmup_steps}"
            )
        return self

    @property
    def global_batch_size(self) -> int:
        """Rows per optimizer step: ``micro_batch_size * grad_accum_steps``."""
        return self.micro_batch_size * self.grad_accum_steps
