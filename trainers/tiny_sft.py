"""The tiny SFT'd model that the learnability checks start from, built in one place.

A Stage Bank of the benchmark's training tasks (success and recovery trajectories), a
byte-level BPE tokenizer trained on its SFT rows, a random-init Qwen3-style model
(:mod:`bat_gym.trainers.tiny_model`), the tokenized SFT export, and cold-start SFT on
the teacher rows. ``tests/trainers/test_learning.py``, the study (:mod:`bat_gym.trainers.study`)
and ``benchmarks/grpo_one_state.py`` all start here, so the recipe their figures
describe is one recipe. Nothing is downloaded; a rerun into the same folder reuses the
model, the export and a finished SFT run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import ConfigError
from bat_gym.trainers.tiny_model import build_tiny_model

if TYPE_CHECKING:
    from bat_gym.bank import StageBank
    from bat_gym.benchmark import Benchmark
    from bat_gym.sft import SFTRow
    from bat_gym.trainers.sft import SFTConfig

__all__ = [
    "TinySetup",
    "build_tiny_setup",
    "row_corpus",
    "state_rewards",
    "tiny_sft_config",
    "train_tiny_sft",
]

SFT_MAX_LENGTH = 4096
"""Longest rendered SFT row in tokens; longer rows are rejected by the export."""


@dataclass(frozen=True)
class TinySetup:
    """What :func:`build_tiny_setup` built under its folder."""

    bench: Benchmark
    bank: StageBank
    init: Path
    """The random-init model and its tokenizer (loadable with ``from_pretrained``)."""
    sft_data: Path
    """The SFT export: ``train.jsonl``, ``validation.jsonl``, ``manifest.json``."""


def row_corpus(rows: Iterable[SFTRow]) -> list[str]:
    """The text a model trained on ``rows`` reads and writes: their contexts and targets."""
    rows = list(rows)
    texts = [m.get("content") or "" for r in rows for m in r.context]
    return texts + [r.target.content for r in rows]


def build_tiny_setup(
    out: str | Path,
    benchmark: str = "skill_ladder",
    *,
    tasks_per_track: int = 8,
    base_model: str | Path | None = None,
) -> TinySetup:
    """Build (or reuse) the bank, the random-init model and the SFT export under ``out``.

    Layout: ``out/bank``, ``out/init`` (model and tokenizer), ``out/sft-data``. The
    tokenizer learns the bank's prompts and teacher turns, so the model's vocabulary
    covers exactly what it will read and write.

    Args:
        out: the folder (created if missing).
        benchmark: a registered benchmark name.
        tasks_per_track: training tasks per track in the bank, each with a success and a
            recovery trajectory.
        base_model: a checkpoint folder to start from instead of the tiny model (the
            sizes a GPU user runs): nothing is built in ``out/init``, and the SFT export
            is tokenized with the checkpoint's own tokenizer.
    """
    from transformers import AutoTokenizer

    from bat_gym.bank import build_bank
    from bat_gym.catalog import get_benchmark
    from bat_gym.sft import export_sft, sft_rows

    out = Path(out)
    if base_model is not None and not (Path(base_model) / "config.json").is_file():
        raise ConfigError(
            f"base_model {base_model} is not a Hugging Face checkpoint folder (no config.json); "
            "give a local folder saved with save_pretrained"
        )
    bench = get_benchmark(benchmark)
    bank = build_bank(
        bench, out / "bank", tasks_per_track=tasks_per_track, outcomes=("success", "recovery")
    )
    rows = sft_rows(bank, bench)
    init, sft_data = out / "init", out / "sft-data"
    if base_model is not None:
        init = Path(base_model)
    elif not (init / "config.json").is_file():
        # 128 wide (two heads of 64): a 64-wide model was still at 0 held-out reward
        # after 100 SFT steps, where this one already completes episodes.
        build_tiny_model(init, row_corpus(rows), vocab_size=1024, hidden_size=128, num_heads=2)
    if not (sft_data / "train.jsonl").is_file():
        tokenizer = AutoTokenizer.from_pretrained(init)
        export_sft(bank, bench, tokenizer, sft_data, max_length=SFT_MAX_LENGTH, rows=rows)
    return TinySetup(bench=bench, bank=bank, init=init, sft_data=sft_data)


def tiny_sft_config(
    setup: TinySetup, output_dir: str | Path, *, steps: int, **overrides: Any
) -> SFTConfig:
    """The cold-start SFT recipe for the tiny model: ``steps`` CPU steps of 4 rows at lr 2e-3.

    Args:
        setup: what :func:`build_tiny_setup` built.
        output_dir: the SFT run's folder.
        steps: optimizer steps (150 in the slow test, 300 in the study).
        overrides: further :class:`~bat_gym.trainers.sft.SFTConfig` fields.
    """
    from bat_gym.trainers.sft import SFTConfig

    recipe: dict[str, Any] = {
        "model": str(setup.init),
        "data_dir": str(setup.sft_data),
        "output_dir": str(output_dir),
        "lr": 2e-3,  # a random-init model; 2e-5 is the value for 4B-9B models
        "micro_batch_size": 4,
        "grad_accum_steps": 1,
        "max_steps": steps,
        "warmup_steps": min(10, steps),
        "eval_every": 0,
        "save_every": 0,
        "device": "cpu",
    }
    return SFTConfig(**(recipe | overrides))


def train_tiny_sft(setup: TinySetup, output_dir: str | Path, *, steps: int) -> Path:
    """Run :func:`tiny_sft_config`'s recipe (or reuse a finished run); the final checkpoint."""
    from bat_gym.trainers.sft import train

    final = Path(output_dir) / "final"
    if (final / "config.json").is_file():
        return final
    return Path(train(tiny_sft_config(setup, output_dir, steps=steps))["final_dir"])


def state_rewards(
    bank: StageBank,
    model: str | Path,
    state_id: str,
    n: int,
    *,
    seed: int,
    budgets: Any,
    temperature: float,
    max_new_tokens: int,
) -> list[float]:
    """Rubric rewards of ``n`` E2E episodes played from one state through GRPO's rollouts.

    Episode ``i`` draws by the seed key ``("measure", i)``, so two models measured with
    the same ``seed`` see the same draws however the eight envs' turns interleave
    (common random numbers: only the policy differs).

    Args:
        bank: the Stage Bank holding ``state_id``.
        model: a checkpoint folder.
        state_id: an E2E state of ``bank``.
        n: episodes.
        seed: the policy's sampling seed.
        budgets: the episode budgets (:class:`bat_gym.core.spec.Budgets`).
        temperature: sampling temperature.
        max_new_tokens: tokens per sampled turn.
    """
    import gymnasium as gym

    from bat_gym.policies.transformers_policy import TransformersPolicy
    from bat_gym.trainers.rollout import RolloutWorkers

    benchmark = bank.info.benchmark
    policy = TransformersPolicy(
        model, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed
    )
    workers = RolloutWorkers(
        lambda: gym.make("bat/E2E-v0", benchmark=benchmark, states=bank.root, budgets=budgets),
        lambda prompts, k, **seeding: policy.generate_tokens(prompts, max_new_tokens=k, **seeding),
        policy.tokenizer,
        max_new_tokens=max_new_tokens,
        num_envs=8,
        max_batch_size=8,
    )
    try:
        return [r.reward for r in workers.play([state_id] * n, [("measure", i) for i in range(n)])]
    finally:
        workers.close()
        policy.close()
