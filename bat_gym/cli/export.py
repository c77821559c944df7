"""``bat-gym export``: stored runs and benchmark states in the formats other tools read.

``export atif RUN_DIR`` writes every stored episode as an ATIF trajectory
(:mod:`bat_gym.integrations.atif`); ``export harbor`` writes Harbor task folders
(:mod:`bat_gym.integrations.harbor`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
    from bat_gym.integrations.atif import export_atif

    written = export_atif(run_dir, out)
    typer.echo(f"{len(written)} ATIF trajectories -> {out}")
