"""Options several commands take, declared once: the same flag reads the same everywhere.

Each is an ``Annotated`` type for a typer parameter; give it a default as usual
(``backend: Backend = "local"``).
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["Backend", "BenchmarkName", "EpisodeWorkers", "Quiet", "Tracks"]

BenchmarkName = Annotated[
    str | None,
    typer.Option("--benchmark", help="Benchmark name (default: the default benchmark)."),
]
Backend = Annotated[str, typer.Option("--backend", help="Sandbox backend: local or docker.")]
EpisodeWorkers = Annotated[
    int, typer.Option("--workers", min=1, help="Episodes played at once, one sandbox each.")
]
Tracks = Annotated[
    list[str] | None,
    typer.Option("--track", help="Only this track (repeatable). Default: all."),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        help="No progress display (it is off anyway when stdout is not a terminal).",
    ),
]
