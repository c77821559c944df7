"""``bat-gym eval``: evaluate a policy on a benchmark's held-out cells."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import (
    Backend,
    BenchmarkName,
    ChatTemplateKwargs,
    EpisodeWorkers,
    MaxNewTokens,
    Quiet,
    Temperature,
    Tracks,
    build_policy,
    policy_options,
)
from bat_gym.core import progress
from bat_gym.policies import spec_forms


def evaluate(
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help="Policy spec: " + " | ".join(spec_forms()),
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Results directory; rerun into it to resume.")],
    benchmark: BenchmarkName = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats",
            min=1,
            help="Held-out tasks per track. Default, and the most allowed: the benchmark's "
            "splits.heldout_repeats (10 for MedBench-Lite), the tasks the leakage audit covers.",
        ),
    ] = None,
    track: Tracks = None,
    workers: EpisodeWorkers = 2,
    backend: Backend = "local",
    max_attempts: Annotated[
        int,
        typer.Option("--max-attempts", min=1, help="Tries per cell on infrastructure failure."),
    ] = 2,
    max_turns: Annotated[
        int | None,
        typer.Option("--max-turns", min=1, help="Override the benchmark's turn budget."),
    ] = None,
    max_new_tokens: MaxNewTokens = None,
    temperature: Temperature = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Sampling seed (hf, vllm, openai): each cell draws from its own."
        ),
    ] = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Play episodes on Ray actors: local, auto, or a cluster address (HOST:6379).",
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Play the policy on every held-out cell as an E2E episode and write the reports.

    OUT gets report.md, report.json, stages.png and manifest.json (evaluation side), and
    aggregates.json, the only file a training loop may read.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.evaluation import EvalConfig
    from bat_gym.evaluation import evaluate as run_evaluation
    from bat_gym.evaluation.manifest import EvalManifest

    bench = get_benchmark(benchmark)
    allowed = bench.spec.splits.heldout_repeats
    if repeats is not None and repeats > allowed:
        raise typer.BadParameter(
            f"{bench.name} declares splits.heldout_repeats = {allowed}, the held-out tasks per "
            f"track the leakage audit covers; ask for at most {allowed}",
            param_hint="--repeats",
        )
    budgets = None
    if max_turns is not None:
        budgets = bench.spec.budgets.model_copy(update={"max_turns": max_turns})
    options = policy_options(policy, max_new_tokens, temperature, seed, chat_template_kwargs)
    cfg = EvalConfig(
        repeats=repeats,
        tracks=tuple(track or ()),
        workers=workers,
        backend=backend,
        max_attempts=max_attempts,
        budgets=budgets,
        progress=not quiet,
        ray=ray,
    )
    agent = build_policy(policy, options)
    with agent, progress.use(progress.for_cli(quiet)):
        agent.check_benchmark(bench)  # one clear line, before any cell runs
        report = run_evaluation(bench, agent, out, cfg)
    agg = report.aggregates

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    ci = report.intervals["overall"]
    typer.echo(
        f"overall {fmt(agg.overall)} [95% CI {fmt(ci.low)}, {fmt(ci.high)}]  task {fmt(agg.task)}  "
        + "  ".join(f"{s} {fmt(v)}" for s, v in agg.stages.items())
    )
    typer.echo(
        f"{agg.completion.valid}/{agg.completion.runs} valid cells, "
        f"{EvalManifest.model_validate(report.manifest).timing.wall_s:.1f} s -> {out}/report.md, "
        f"{out}/aggregates.json"
    )
    if agg.completion.invalid:
        typer.secho(
            f"{agg.completion.invalid} invalid cell(s) (infrastructure): rerun the same command "
            "to retry them; a run with invalid cells cannot feed the gate",
            fg=typer.colors.YELLOW,
            err=True,
        )
        raise typer.Exit(2)
