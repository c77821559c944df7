"""The evaluation run config: one ``bat-gym eval`` of a checkpoint, in a child process.

BiCuRL evaluates each candidate through the command line (the firewall is a process
boundary, see :mod:`bat_gym.trainers.bicurl`); this config is what that command is
told, and :meth:`EvalRunConfig.command` writes its argument list.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import Field

from bat_gym.trainers.configs.base import RunConfig

__all__ = ["EvalRunConfig"]


class EvalRunConfig(RunConfig):
    """Settings of a held-out evaluation of one checkpoint (``bat-gym eval``)."""

    benchmark: str | None = None
    """Registered benchmark name (default: the installed default benchmark)."""
    repeats: int | None = Field(None, ge=1)
    """Held-out tasks per track (None: the benchmark's ``splits.heldout_repeats``)."""
    tracks: tuple[str, ...] = ()
    """Tracks evaluated (empty: every track of the benchmark)."""
    workers: int = Field(2, ge=1)
    """Episodes played at once, one sandbox each."""
    max_turns: int | None = None
    """Turn budget of an episode (None: the benchmark's)."""
    max_new_tokens: int | None = None
    """Tokens per turn (None: the policy's default)."""
    temperature: float | None = None
    """Sampling temperature (None: the policy's default)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Chat template arguments, the same as training's (e.g. ``{"enable_thinking": False}``)."""
    seed: int = 0
    """Sampling seed; each cell draws from its own."""
    policy: Literal["hf", "vllm"] = "hf"
    """How the checkpoint is served: ``hf`` (transformers, CPU or GPU) or ``vllm``
    (vLLM's offline engine, on a GPU; the ``vllm`` extra)."""

    def command(self, model_dir: str, out_dir: str) -> list[str]:
        """The child process's argument list: evaluate ``<policy>:model_dir`` into ``out_dir``."""
        cmd = [
            sys.executable, "-m", "bat_gym.cli", "eval",
            "--policy", f"{self.policy}:{model_dir}",
            "--out", out_dir,
            "--workers", str(self.workers),
            "--quiet",
        ]  # fmt: skip
        if self.repeats is not None:
            cmd += ["--repeats", str(self.repeats)]
        if self.benchmark:
            cmd += ["--benchmark", self.benchmark]
        for track in self.tracks:
            cmd += ["--track", track]
        for flag, value in (
            ("--max-turns", self.max_turns),
            ("--max-new-tokens", self.max_new_tokens),
            ("--temperature", self.temperature),
        ):
            if value is not None:
                cmd += [flag, str(value)]
        if self.chat_template_kwargs:
            cmd += ["--chat-template-kwargs", json.dumps(self.chat_template_kwargs)]
        return [*cmd, "--seed", str(self.seed)]
