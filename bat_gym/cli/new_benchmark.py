"""``bat-gym new-benchmark NAME``: scaffold a working benchmark plugin package."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["new_benchmark"]


def new_benchmark(
    name: Annotated[
        str, typer.Argument(help="Benchmark name: a lowercase Python identifier, e.g. my_bench.")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Package directory to create (default: ./NAME)."),
    ] = None,
    stages: Annotated[
        int,
        typer.Option(
            "--stages",
            help="Number of stages, 2 to 5: Setup, Submit; then Validate, Plan and Infer "
            "are added in that order.",
        ),
    ] = 2,
) -> None:
    """Write a benchmark plugin package that installs, tests, builds a bank and evaluates.

    The package has its own pyproject.toml (the bat_gym.benchmarks entry point), spec,
    seeded task generator, scripted teacher, naive baseline, rubric contracts, task
    metric and tests. Its README says which env ids serve it.
    """
    from bat_gym import scaffold

    made = scaffold.new_benchmark(name, out, stages=stages)
    root = made.root
    stage_list = ", ".join(f"{sid} {sname}" for sid, sname in made.stages)
    typer.echo(f"wrote {len(made.files)} files to {root}/ (stages {stage_list})")
    typer.echo(f"env ids: {', '.join(made.env_ids)} (with benchmark={name!r})")
    # This interpreter's own pip and pytest: a bare `pip` may be another Python's, where
    # the package's dependency `bat-gym` (not on the package index) is not installed.
    python = shlex.quote(sys.executable)
    typer.echo(
        "next (bat-gym is not on the package index: pip finds it installed in this Python):\n"
        f"  {python} -m pip install -e {shlex.quote(f'{root}[test]')}\n"
        f"  {python} -m pytest {shlex.quote(str(root / 'tests'))}\n"
        f"  bat-gym bank build --benchmark {name} --out banks/{name}\n"
        f"  bat-gym eval --benchmark {name} --policy teacher --out evals/{name}-teacher\n"
        f"  bat-gym audit-reward --benchmark {name}"
    )
