"""``bat-gym study run STUDY.yaml`` and ``bat-gym study report DIR``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["study_app"]

study_app = typer.Typer(
    no_args_is_help=True,
    help="The paper's comparison as arms x seeds: cached, resumable units, a table and plots.",
)


@study_app.command("run")
def run(
    study_file: Annotated[
        Path,
        typer.Argument(help="The study's YAML file (e.g. benchmarks/studies/skill_ladder.yaml)."),
    ],
    quick: Annotated[
        bool, typer.Option("--quick", help="The file's quick: sizes (smaller everything).")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Study folder; rerun into it to resume (default: runs/study-NAME[-quick]).",
        ),
    ] = None,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch intra-op threads.")] = 2,
    base_model: Annotated[
        Path | None,
        typer.Option(
            "--base-model",
            help="A local checkpoint folder SFT starts from (overrides the file's base_model).",
        ),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option(
            "--seeds",
            min=1,
            help="Seeds per arm (overrides the file's); more seeds into a study's folder "
            "add units and keep the finished ones.",
        ),
    ] = None,
) -> Path:
    """Run (or resume) every arm x seed of a study, then write its report.

    A finished unit is never rerun; a killed one resumes where its trainer allows.
    """
    from bat_gym.trainers.study.config import load_study

    study = load_study(study_file, quick=quick)
    if base_model is not None:
        study = study.model_copy(update={"base_model": str(base_model)})
    if seeds is not None:
        study = study.model_copy(update={"seeds": seeds})
    study.check_base_model()
    folder = out or Path("runs") / f"study-{study.name}{'-quick' if quick else ''}"
    # Child evaluations (BiCuRL's) read the thread setting from the environment.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    from bat_gym.trainers.study.runner import run_study

    torch.set_num_threads(threads)

    def line(arm: str, seed: int, outcome: str, seconds: float) -> None:
        typer.echo(f"{arm} seed {seed}: {outcome} ({seconds:.0f} s)")

    run_study(study, folder, on_unit=line)
    typer.echo(f"report: {folder / 'results.md'}  (bat-gym view {folder})")
    return folder


@study_app.command("report")
def report(
    folder: Annotated[Path, typer.Argument(help="A study folder (study run --out).")],
) -> None:
    """Rebuild results.json, results.md and the PNGs from a study's finished units."""
    from bat_gym.core.errors import ConfigError
    from bat_gym.trainers.study.report import write_report

    if not (folder / "study.json").is_file():
        raise ConfigError(f"{folder} is not a study folder (no study.json); give a study run --out")
    res = write_report(folder)
    typer.echo(f"{len(res['arms'])} arms -> {folder / 'results.md'}")
