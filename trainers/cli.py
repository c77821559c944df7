"""``bat-gym train sft|grpo`` and ``bat-gym loop``: the trainers on the command line.

Registered through the ``bat_gym.commands`` entry points, so the core CLI never imports
a trainer; each command parses options, builds the trainer's config and calls it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import BenchmarkName, ChatTemplateKwargs, parse_chat_template_kwargs
from bat_gym.selection import SELECTORS

__all__ = ["train_app", "loop", "tiny_model"]

train_app = typer.Typer(no_args_is_help=True, help="Train a policy: cold-start SFT, GRPO.")

Model = Annotated[str, typer.Option("--model", help="Starting Hugging Face model directory.")]
Out = Annotated[Path, typer.Option("--out", help="Run directory; rerun into it to resume.")]
BankOpt = Annotated[
    Path | None, typer.Option("--bank", help="Stage Bank directory (default: the default bank).")
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of data order, sampling and init.")]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:1, ...")]


@train_app.command("sft")
def sft(
    model: Model,
    out: Out,
    benchmark: BenchmarkName = None,
    bank: BankOpt = None,
    max_length: Annotated[
        int, typer.Option("--max-length", min=16, help="Rows longer than this are rejected.")
    ] = 8192,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 200,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 2e-5,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", min=1)] = 1,
    grad_accum: Annotated[
        int, typer.Option("--grad-accum", min=1, help="Micro-batches per optimizer step.")
    ] = 32,
    warmup_steps: Annotated[
        int | None,
        typer.Option("--warmup-steps", min=0, help="Default: 10, or steps // 10 if fewer."),
    ] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", min=0)] = 50,
    save_every: Annotated[int, typer.Option("--save-every", min=0)] = 50,
    chat_template_kwargs: ChatTemplateKwargs = None,
    seed: Seed = 0,
    device: Device = "auto",
) -> None:
    """Cold-start SFT on the bank's SFT view (one target action per row).

    The view is rendered with the model's own chat template into OUT/data (reused when
    present and rendered with the same --chat-template-kwargs), then the model is
    fine-tuned on the target tokens only.
    """
    from transformers import AutoTokenizer

    from bat_gym.bank import StageBank, default_bank
    from bat_gym.registry import get_benchmark
    from bat_gym.sft import export_sft
    from bat_gym.trainers.sft import SFTConfig, train

    template_kwargs = parse_chat_template_kwargs(chat_template_kwargs)
    bench = get_benchmark(benchmark)
    data = out / "data"
    if not (data / "train.jsonl").is_file():
        if bank:
            states = StageBank(bank)
        else:
            # The whole default grid, built where missing: shown while it builds.
            from bat_gym import progress

            with progress.use(progress.for_cli()):
                states = default_bank(bench)
        tokenizer = AutoTokenizer.from_pretrained(model)
        manifest = export_sft(
            states, bench, tokenizer, data, max_length, chat_template_kwargs=template_kwargs
        )
        typer.echo(f"SFT view: {json.dumps({k: manifest[k] for k in manifest if k != 'rejected'})}")
    cfg = SFTConfig(
        model=model,
        data_dir=str(data),
        chat_template_kwargs=template_kwargs,
        output_dir=str(out),
        lr=lr,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=grad_accum,
        max_steps=steps,
        warmup_steps=min(10, steps // 10) if warmup_steps is None else warmup_steps,
        eval_every=eval_every,
        save_every=save_every,
        seed=seed,
        device=device,
    )
    summary = train(cfg)
    typer.echo(
        f"SFT: step {summary['step']}, last train loss {summary['train_loss'][-1]:.4f} -> {out}/final"
    )


@train_app.command("grpo")
def grpo(
    model: Model,
    out: Out,
    benchmark: BenchmarkName = None,
    bank: BankOpt = None,
    target: Annotated[
        str | None,
        typer.Option("--target", help="Curriculum target stage (S1..S5, or a name: Validate)."),
    ] = None,
    state_id: Annotated[
        list[str] | None,
        typer.Option("--state-id", help="Train on fixed states instead (repeatable)."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1)] = 50,
    groups_per_step: Annotated[int, typer.Option("--groups-per-step", min=1)] = 8,
    group_size: Annotated[int, typer.Option("--group-size", min=2)] = 4,
    lr: Annotated[float, typer.Option("--lr")] = 2.5e-7,
    warmup_steps: Annotated[
        int, typer.Option("--warmup-steps", min=0, help="Linear lr warmup (default: none).")
    ] = 0,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.7,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 512,
    max_total_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-total-tokens",
            min=2,
            help="Cap on an episode's prompt + response tokens; it ends 'length' before "
            "passing it (default: the model's context length).",
        ),
    ] = None,
    cut_turn: Annotated[
        str,
        typer.Option(
            "--cut-turn",
            help="A turn cut by --max-new-tokens (no stop token): 'end' the episode there "
            "(default; the unfinished message is not run) or 'act' on its text.",
        ),
    ] = "end",
    overlong: Annotated[
        str,
        typer.Option(
            "--overlong",
            help="Episodes a token limit ended: 'mask' them out of the loss (default, DAPO's "
            "overlong filtering), 'keep' them, or 'penalize' their reward.",
        ),
    ] = "mask",
    overlong_penalty: Annotated[
        float,
        typer.Option(
            "--overlong-penalty", min=0.0, help="Reward subtracted under --overlong penalize."
        ),
    ] = 1.0,
    chat_template_kwargs: ChatTemplateKwargs = None,
    max_turns: Annotated[int | None, typer.Option("--max-turns", min=1)] = None,
    kl_coef: Annotated[float, typer.Option("--kl-coef", min=0.0)] = 0.006,
    kl_reference: Annotated[
        str | None,
        typer.Option("--kl-reference", help="KL reference model directory (default: the --model)."),
    ] = None,
    generator: Annotated[
        str,
        typer.Option(
            "--generator", help="Rollout sampler: transformers (the trained model) or vllm."
        ),
    ] = "transformers",
    gradient_checkpointing: Annotated[
        bool,
        typer.Option(
            "--gradient-checkpointing/--no-gradient-checkpointing",
            help="Recompute the decoder's activations in the update's backward instead of "
            "keeping them (default: on, as in TRL; about a third more update compute).",
        ),
    ] = True,
    num_envs: Annotated[int, typer.Option("--num-envs", min=1)] = 8,
    ray: Annotated[
        str | None,
        typer.Option("--ray", help="Rollout envs on Ray actors: local, auto, or HOST:6379."),
    ] = None,
    seed: Seed = 0,
    device: Device = "auto",
) -> None:
    """Multi-turn GRPO on bat envs: a curriculum round (--target) or fixed --state-id's."""
    from bat_gym.trainers.grpo import GRPOConfig, train

    if (target is None) == (not state_id):
        raise typer.BadParameter("give exactly one of --target and --state-id")
    for flag, value, allowed in (
        ("--cut-turn", cut_turn, ("end", "act")),
        ("--overlong", overlong, ("mask", "keep", "penalize")),
    ):
        if value not in allowed:
            raise typer.BadParameter(f"use one of {', '.join(allowed)}", param_hint=flag)
    cfg = GRPOConfig(
        model=model,
        output_dir=str(out),
        benchmark=benchmark,
        bank=str(bank) if bank else None,
        target=target,
        state_ids=tuple(state_id or ()),
        steps=steps,
        groups_per_step=groups_per_step,
        group_size=group_size,
        lr=lr,
        warmup_steps=warmup_steps,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        max_total_tokens=max_total_tokens,
        cut_turn=cut_turn,  # type: ignore[arg-type]
        overlong=overlong,  # type: ignore[arg-type]
        overlong_penalty=overlong_penalty,
        chat_template_kwargs=parse_chat_template_kwargs(chat_template_kwargs),
        max_turns=max_turns,
        kl_coef=kl_coef,
        kl_reference=kl_reference,
        generator=generator,  # type: ignore[arg-type]
        gradient_checkpointing=gradient_checkpointing,
        num_envs=num_envs,
        ray=ray,
        seed=seed,
        device=device,
    )

    def show(m: dict) -> None:
        typer.echo(
            f"step {m['step']:4d}  reward {m['reward']:.3f}  kl {m['kl']:.4f}  "
            f"clip {m['clip_fraction']:.3f}  zero-adv groups {m['zero_advantage_groups']:.2f}  "
            f"len {m['response_tokens']:.0f}  cut {m['length_cut']:.2f}  "
            f"({m['rollout_s']:.1f} s + {m['update_s']:.1f} s)"
            + "".join(f"  {pool} {r:.3f}" for pool, r in m["reward_by_pool"].items())
        )

    summary = train(cfg, on_step=show)
    typer.echo(f"GRPO: {summary['steps']} steps -> {summary['final']}")


def loop(
    model: Model,
    out: Out,
    benchmark: BenchmarkName = None,
    bank: BankOpt = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 10,
    steps_per_round: Annotated[int, typer.Option("--steps-per-round", min=1)] = 50,
    eval_repeats: Annotated[
        int | None,
        typer.Option(
            "--eval-repeats", min=1, help="Default: the benchmark's splits.heldout_repeats."
        ),
    ] = None,
    eval_max_turns: Annotated[int | None, typer.Option("--eval-max-turns", min=1)] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", min=1)] = None,
    max_turns: Annotated[int | None, typer.Option("--max-turns", min=1)] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", min=2)] = None,
    lr: Annotated[float | None, typer.Option("--lr")] = None,
    num_envs: Annotated[int | None, typer.Option("--num-envs", min=1)] = None,
    selector: Annotated[
        str, typer.Option("--selector", help=f"Target selector: {', '.join(SELECTORS)}.")
    ] = "paper",
    kl_reference: Annotated[
        str,
        typer.Option(
            "--kl-reference",
            help="KL toward each round's incumbent (the paper's setting) or the --model start.",
        ),
    ] = "incumbent",
    chat_template_kwargs: ChatTemplateKwargs = None,
    seed: Seed = 0,
) -> None:
    """BiCuRL: evaluate, pick the weakest stage, GRPO on it, gate, keep the best; repeat.

    Rerun into the same --out to resume after a kill.
    """
    from bat_gym.trainers.bicurl import BiCuRLConfig, run_loop

    grpo_overrides = {
        k: v
        for k, v in {
            "max_new_tokens": max_new_tokens,
            "max_turns": max_turns,
            "group_size": group_size,
            "lr": lr,
            "num_envs": num_envs,
        }.items()
        if v is not None
    }
    cfg = BiCuRLConfig(
        model=model,
        output_dir=str(out),
        benchmark=benchmark,
        bank=str(bank) if bank else None,
        rounds=rounds,
        steps_per_round=steps_per_round,
        eval_repeats=eval_repeats,
        eval_max_turns=eval_max_turns or max_turns,
        eval_max_new_tokens=max_new_tokens,
        selector=selector,
        kl_reference=kl_reference,  # type: ignore[arg-type]
        grpo=grpo_overrides,
        chat_template_kwargs=parse_chat_template_kwargs(chat_template_kwargs),
        seed=seed,
    )
    from bat_gym import progress

    with progress.use(progress.for_cli()):
        state = run_loop(cfg)
    typer.echo(f"best eligible checkpoint: {state.incumbent}  (report: {out}/report.md)")


def tiny_model(
    out: Annotated[Path, typer.Argument(help="Directory to write the model and tokenizer to.")],
    benchmark: BenchmarkName = None,
    hidden_size: Annotated[
        int, typer.Option("--hidden-size", min=64, help="Width; heads are 64 wide.")
    ] = 128,
    layers: Annotated[int, typer.Option("--layers", min=1, help="Decoder layers.")] = 2,
    vocab_size: Annotated[int, typer.Option("--vocab-size", min=300, help="BPE vocabulary.")] = 1024,
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
