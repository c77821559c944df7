"""``bat-gym train sft|grpo`` and ``bat-gym loop``: the trainers on the command line.

Registered through the ``bat_gym.commands`` entry points, so the core CLI never imports
a trainer; each command parses options, builds the trainer's config and calls it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import BenchmarkName

__all__ = ["train_app", "loop"]

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
    seed: Seed = 0,
    device: Device = "auto",
) -> None:
    """Cold-start SFT on the bank's SFT view (one target action per row).

    The view is rendered with the model's own chat template into OUT/data (reused when
    present), then the model is fine-tuned on the target tokens only.
    """
    from transformers import AutoTokenizer

    from bat_gym.bank import StageBank, default_bank
    from bat_gym.registry import get_benchmark
    from bat_gym.sft import export_sft
    from bat_gym.trainers.sft import SFTConfig, train

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
        manifest = export_sft(states, bench, tokenizer, data, max_length)
        typer.echo(f"SFT view: {json.dumps({k: manifest[k] for k in manifest if k != 'rejected'})}")
    cfg = SFTConfig(
        model=model,
        data_dir=str(data),
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
        typer.Option("--target", help="Curriculum target stage (S1..S5, a name, or E2E)."),
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
        max_turns=max_turns,
        kl_coef=kl_coef,
        kl_reference=kl_reference,
        generator=generator,  # type: ignore[arg-type]
        num_envs=num_envs,
        ray=ray,
        seed=seed,
        device=device,
    )

    def show(m: dict) -> None:
        typer.echo(
            f"step {m['step']:4d}  reward {m['reward']:.3f}  kl {m['kl']:.4f}  "
            f"clip {m['clip_fraction']:.3f}  zero-adv groups {m['zero_advantage_groups']:.2f}  "
            f"len {m['response_tokens']:.0f}  ({m['rollout_s']:.1f} s + {m['update_s']:.1f} s)"
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
        str, typer.Option("--selector", help="paper (default), deficit or progress.")
    ] = "paper",
    kl_reference: Annotated[
        str,
        typer.Option(
            "--kl-reference",
            help="KL toward each round's incumbent (the paper's setting) or the --model start.",
        ),
    ] = "incumbent",
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
        seed=seed,
    )
    state = run_loop(cfg)
    typer.echo(f"best eligible checkpoint: {state.incumbent}  (report: {out}/report.md)")
