"""``bat-gym view``: a local web page over run directories, or the same pages as a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bat_gym.core.errors import ConfigError

__all__ = ["view"]


def view(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories: evaluations (eval --out), Stage Banks (bank build --out), "
            "GRPO runs (train grpo --out), BiCuRL runs (loop --out).",
            show_default=False,
        ),
    ],
    static: Annotated[
        Path | None,
        typer.Option(
            "--static",
            help="Write the pages into this folder (opens from disk, no server) instead of serving.",
        ),
    ] = None,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1; 0 picks a free one.")
    ] = 0,
) -> None:
    """Show episodes, verdicts and run curves; serves on 127.0.0.1 until Ctrl-C."""
    from bat_gym.viewer import Site, make_server

    site = Site(list(paths))
    if static is not None:
        out = static.resolve()
        for run in site.runs:
            # The viewer never writes into a run: a bank or a training run is what training reads.
            if out == run.path or run.path in out.parents:
                raise ConfigError(
                    f"--static {static} is inside the run {run.path}; the viewer writes nothing "
                    "where runs live: give a folder outside every run directory"
                )
        n = site.export(out)
        typer.echo(f"{n} files -> {out / 'index.html'}")
        return
    server = make_server(site, port)
    try:
        typer.echo(f"bat-gym view: http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops)")
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("stopped")
    finally:
        server.server_close()
