"""``bat-gym train sft|grpo`` and ``bat-gym loop``: the trainers on the command line.

Registered through the ``bat_gym.commands`` entry points, so the core CLI never imports
a trainer; each command parses options, builds the trainer's config and calls it. The
options are the fields of the torch-free run configs (:mod:`bat_gym.trainers.configs`,
read by :mod:`bat_gym.trainers.config_options`): names, defaults and help have one
source, the config.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from bat_gym.cli.options import BenchmarkName
from bat_gym.trainers.config_options import (
    ConfigField,
    config_command,
    config_fields,
    config_values,
    field_option,
)
from bat_gym.trainers.configs import BiCuRLConfig, GRPOConfig, SFTConfig

__all__ = ["train_app", "loop", "tiny_model"]

# What a trainer command prints is its own progress; the libraries' notices (weight-loading
# and shard-writing bars, transformers' info and deprecation logs, TRL's "experimental"
# warning) buried it. Set before they are imported; a user's own setting wins.
for _name, _value in (
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("TRL_EXPERIMENTAL_SILENCE", "1"),
):
    os.environ.setdefault(_name, _value)

train_app = typer.Typer(no_args_is_help=True, help="Train a policy: cold-start SFT, GRPO.")

Seed = Annotated[int, typer.Option("--seed", help="Seed of the model's random init.")]
BankOpt = Annotated[
    Path | None, typer.Option("--bank", help="Stage Bank directory (default: the default bank).")
]
MaxLength = Annotated[
    int, typer.Option("--max-length", min=16, help="Rows longer than this are rejected.")
]

_SFT = config_fields(SFTConfig)
_GRPO = config_fields(GRPOConfig)
_BICURL = config_fields(BiCuRLConfig)

# Older spellings of options, kept working.
_ALIASES = {
    "output_dir": ("--out",),
    "max_steps": ("--steps",),
    "grad_accum_steps": ("--grad-accum",),
    "state_ids": ("--state-id",),
    "eval_tracks": ("--eval-track",),
}

# The one option whose default the command computes (from --steps) instead of the config's.
_SFT_WARMUP_HELP = (
    "Linear warmup from 0 to lr over this many steps. Default: 10, or steps // 10 if fewer."
)

# The GRPO fields `bat-gym loop` sets for every round with a flag of their own (more
# through --grpo); None keeps GRPO's default.
_LOOP_GRPO = ("max_new_tokens", "max_turns", "group_size", "lr", "num_envs")


def _options(
    fields: tuple[ConfigField, ...], *, skip: tuple[str, ...] = (), **overrides: Any
) -> list[inspect.Parameter]:
    return [
        field_option(f, names=_ALIASES.get(f.name, ()), **overrides.get(f.name, {}))
        for f in fields
        if f.name not in skip
    ]


def _config(make: Any, kwargs: dict[str, Any]) -> Any:
    """The config, or the config's own complaint as a usage error (exit 2, one line)."""
    try:
        return make(**kwargs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _sft(values: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    from bat_gym.bank import StageBank, default_bank
    from bat_gym.catalog import get_benchmark
    from bat_gym.sft import export_sft
    from bat_gym.trainers.sft import train

    kwargs = config_values(_SFT, values, skip=("data_dir",))
    out = Path(kwargs["output_dir"])
    template_kwargs = kwargs["chat_template_kwargs"] or {}
    bench = get_benchmark(values["benchmark"])
    data = out / "data"
    if not (data / "train.jsonl").is_file():
        if values["bank"]:
            states = StageBank(values["bank"])
        else:
            # The whole default grid, built where missing: shown while it builds.
            from bat_gym.core import progress

            with progress.use(progress.for_cli()):
                states = default_bank(bench)
        tokenizer = AutoTokenizer.from_pretrained(kwargs["model"])
        manifest = export_sft(
            states,
            bench,
            tokenizer,
            data,
            values["max_length"],
            chat_template_kwargs=template_kwargs,
        )
        typer.echo(_sft_view_line(manifest, data))
    steps = kwargs["max_steps"]
    if kwargs["warmup_steps"] is None:
        kwargs["warmup_steps"] = min(10, steps // 10)
    kwargs.update(data_dir=str(data), chat_template_kwargs=template_kwargs)
    summary = train(_config(SFTConfig, kwargs))
    typer.echo(
        f"SFT: step {summary['step']}, last train loss {summary['train_loss'][-1]:.4f} -> {out}/final"
    )


def _sft_view_line(manifest: dict[str, Any], data: Path) -> str:
    """One line on the exported SFT view: rows per split, and how many were dropped why."""
    splits = ", ".join(
        f"{name} {part['rows']} ({part['tokens']} tokens)"
        for name, part in manifest.get("splits", {}).items()
    )
    dropped = "; ".join(
        f"{n} dropped as {reason.replace('_', ' ')}"
        for reason, n in manifest.get("rejected_by_reason", {}).items()
    )
    return (
        f"SFT view: {manifest.get('rows', 0)} rows -> {splits or 'no split'}; "
        f"{dropped or 'none dropped'} (max length {manifest.get('max_length')} tokens; "
        f"details in {data / 'manifest.json'})"
    )


train_app.command("sft")(
    config_command(
        [
            *_options(
                _SFT,
                skip=("data_dir",),
                warmup_steps={"default": None, "help": _SFT_WARMUP_HELP},
            ),
            inspect.Parameter(
                "benchmark", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BenchmarkName
            ),
            inspect.Parameter(
                "bank", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BankOpt
            ),
            inspect.Parameter(
                "max_length", inspect.Parameter.KEYWORD_ONLY, default=8192, annotation=MaxLength
            ),
        ],
        _sft,
        doc="""Cold-start SFT on the bank's SFT view (one target action per row).

    The view is rendered with the model's own chat template into OUT/data (reused when
    present and rendered with the same --chat-template-kwargs), then the model is
    fine-tuned on the target tokens only.
    """,
    )
)


def _grpo(values: dict[str, Any]) -> None:
    from bat_gym.trainers.grpo import train
    from bat_gym.trainers.grpo_metrics import StepMetrics

    kwargs = config_values(_GRPO, values)
    if (kwargs["target"] is None) == (not kwargs["state_ids"]):
        raise typer.BadParameter("give exactly one of --target and --state-id")
    cfg = _config(GRPOConfig, kwargs)

    def show(record: dict) -> None:
        m = StepMetrics.model_validate(record)
        typer.echo(
            f"step {m.step:4d}  reward {m.reward:.3f}  kl {m.kl:.4f}  "
            f"clip {m.clip_fraction:.3f}  zero-adv groups {m.zero_advantage_groups:.2f}  "
            f"len {m.response_tokens:.0f}  cut {m.length_cut:.2f}  fin {m.finished:.2f}  "
            f"({m.rollout_s:.1f} s + {m.update_s:.1f} s)"
            + "".join(f"  {pool} {r:.3f}" for pool, r in m.reward_by_pool.items())
        )

    summary = train(cfg, on_step=show)
    typer.echo(f"GRPO: {summary['steps']} steps -> {summary['final']}")


train_app.command("grpo")(
    config_command(
        _options(_GRPO),
        _grpo,
        doc="Multi-turn GRPO on bat envs: a curriculum round (--target) or fixed --state-id's.",
    )
)


def _loop(values: dict[str, Any]) -> None:
    from bat_gym.core import progress
    from bat_gym.trainers.bicurl import run_loop

    kwargs = config_values(_BICURL, values)
    overrides = {k: values[f"grpo_{k}"] for k in _LOOP_GRPO if values[f"grpo_{k}"] is not None}
    kwargs["grpo"] = {**kwargs["grpo"], **overrides}
    # Evaluation episodes get the training turn and token budgets unless told otherwise.
    if kwargs["eval_max_turns"] is None:
        kwargs["eval_max_turns"] = values["grpo_max_turns"]
    if kwargs["eval_max_new_tokens"] is None:
        kwargs["eval_max_new_tokens"] = values["grpo_max_new_tokens"]
    cfg = _config(BiCuRLConfig, kwargs)
    with progress.use(progress.for_cli()):
        state = run_loop(cfg)
    typer.echo(
        f"best eligible checkpoint: {state.incumbent}  (report: {kwargs['output_dir']}/report.md)"
    )


def _loop_grpo_options() -> list[inspect.Parameter]:
    by_name = {f.name: f for f in _GRPO}
    return [
        field_option(
            by_name[k],
            name=f"grpo_{k}",
            default=None,
            help=f"Every round's GRPO {k} (default: GRPO's, {by_name[k].default}). "
            + by_name[k].help,
        )
        for k in _LOOP_GRPO
    ]


loop = config_command(
    [*_options(_BICURL), *_loop_grpo_options()],
    _loop,
    doc="""BiCuRL: evaluate, pick the weakest stage, GRPO on it, gate, keep the best; repeat.

    Rerun into the same --out to resume after a kill.
    """,
)


def tiny_model(
    out: Annotated[Path, typer.Argument(help="Directory to write the model and tokenizer to.")],
    benchmark: BenchmarkName = None,
    hidden_size: Annotated[
        int, typer.Option("--hidden-size", min=64, help="Width; heads are 64 wide.")
    ] = 128,
    layers: Annotated[int, typer.Option("--layers", min=1, help="Decoder layers.")] = 2,
    vocab_size: Annotated[
        int, typer.Option("--vocab-size", min=300, help="BPE vocabulary.")
    ] = 1024,
    seed: Seed = 0,
) -> None:
    """Build a tiny random-init Qwen3-style model whose tokenizer knows the benchmark's text.

    For trying the trainers on a CPU: nothing is downloaded, and the directory loads
    with AutoModelForCausalLM / AutoTokenizer like any checkpoint (--model OUT).
    """
    from bat_gym.trainers.tiny_model import benchmark_corpus, build_tiny_model

    if hidden_size % 64:
        raise typer.BadParameter("--hidden-size must be a multiple of 64 (heads are 64 wide)")
    build_tiny_model(
        out,
        benchmark_corpus(benchmark),
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=layers,
        num_heads=hidden_size // 64,
        seed=seed,
    )
    typer.echo(f"tiny model ({hidden_size} wide, {layers} layers) -> {out}")
