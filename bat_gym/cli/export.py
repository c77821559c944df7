"""``bat-gym export``: stored runs and benchmark states in the formats other tools read.

``export atif RUN_DIR`` writes every stored episode as an ATIF trajectory
(:mod:`bat_gym.integrations.atif_export`); ``export harbor`` writes Harbor task folders
(:mod:`bat_gym.integrations.harbor`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import BenchmarkName

__all__ = ["app"]

app = typer.Typer(
    no_args_is_help=True, help="Write runs and states in the formats other tools read."
)


@app.command("atif")
def atif(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="An evaluation (eval --out), a GRPO run, a Stage Bank, a BiCuRL run, or an "
            "MCP session (serve mcp --out).",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Folder for the .json trajectories.")],
) -> None:
    """Write every stored episode of RUN_DIR as an ATIF trajectory (one .json each)."""
    from bat_gym.integrations.atif_export import export_atif

    written = export_atif(run_dir, out)
    typer.echo(f"{len(written)} ATIF trajectories -> {out}")


@app.command("harbor")
def harbor(
    out: Annotated[Path, typer.Option("--out", help="Folder for the task folders.")],
    benchmark: BenchmarkName = None,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="A default state to export, by id (repeatable)."),
    ] = None,
    focus: Annotated[
        str | None,
        typer.Option("--focus", help="Export every default state of this focus (E2E, S1, ...)."),
    ] = None,
    held_out: Annotated[
        bool,
        typer.Option("--held-out", help="Export the held-out cells (E2E), as eval plays them."),
    ] = False,
    repeats: Annotated[
        int | None,
        typer.Option("--repeats", min=1, help="Held-out cells per track (default: all)."),
    ] = None,
    track: Annotated[
        list[str] | None, typer.Option("--track", help="Held-out cells of this track only.")
    ] = None,
    solution: Annotated[
        bool,
        typer.Option(
            "--solution",
            help="Also write solution/: the scripted teacher's calls, for `harbor run -a oracle`.",
        ),
    ] = False,
) -> None:
    """Write one Harbor task folder per state or held-out cell, verifier in separate mode."""
    from bat_gym.catalog import get_benchmark
    from bat_gym.integrations.harbor import export_harbor, select_tasks

    bench = get_benchmark(benchmark)
    tasks = select_tasks(
        bench,
        state_ids=state or (),
        focus=focus,
        heldout=held_out,
        repeats=repeats,
        tracks=track or (),
    )
    written = export_harbor(bench, tasks, out, solution=solution)
    typer.echo(f"{len(written)} Harbor tasks -> {out} (base images: {out / 'bat-gym-image'})")
