"""``bat-gym bank``: build and inspect Stage Banks."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="Build and inspect Stage Banks.")


@app.command("build")
def build(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the bank into.")],
    benchmark: Annotated[
        str | None,
        typer.Option("--benchmark", help="Benchmark name (default: the default benchmark)."),
    ] = None,
    tasks_per_track: Annotated[
        int, typer.Option("--tasks-per-track", min=1, help="Training tasks per track.")
    ] = 1,
    backend: Annotated[
        str, typer.Option("--backend", help="Sandbox backend: local or docker.")
    ] = "local",
) -> None:
    """Run the teacher on training tasks and store every stage's start state."""
    from bat_gym.bank import build_bank
    from bat_gym.registry import get_benchmark

    start = time.perf_counter()
    bank = build_bank(
        get_benchmark(benchmark), out, tasks_per_track=tasks_per_track, backend=backend
    )
    typer.echo(f"built {len(bank)} states in {time.perf_counter() - start:.1f} s -> {out}")


@app.command("show")
def show(path: Annotated[Path, typer.Argument(help="A bank directory.")]) -> None:
    """Summarize a bank: states per focus and track."""
    from bat_gym.bank import StageBank

    bank = StageBank(path)
    typer.echo(
        f"{path}: {len(bank)} states of {bank.manifest['benchmark']} {bank.manifest['version']}"
    )
    counts = Counter((s.focus, s.track) for s in bank)
    for (focus, track), n in sorted(counts.items()):
        typer.echo(f"  {focus:4} {track:20} {n}")
