"""``bat-gym audit-reward``: play generic exploits against a benchmark's reward.

Prints the table exploit x stage of mean reward next to the naive baseline and the
teacher, then one summary line. Exit status, for scripts that branch on it:

===== ==========================================================================
0     no exploit beats the targets (or ``--report-only``)
1     some exploit beats the targets
2     usage error, or the audit could not run (the message says why)
===== ==========================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import Backend, BenchmarkName, EpisodeWorkers, Quiet, Tracks
from bat_gym.core import progress

__all__ = ["audit_reward"]


def audit_reward(
    benchmark: BenchmarkName = None,
    states_per_focus: Annotated[
        int,
        typer.Option("--states-per-focus", min=0, help="Stage Bank states sampled per stage."),
    ] = 2,
    cells_per_track: Annotated[
        int, typer.Option("--cells-per-track", min=0, help="Held-out E2E cells per track.")
    ] = 1,
    exploit: Annotated[
        list[str] | None,
        typer.Option("--exploit", help="Play only this exploit (repeatable). Default: all."),
    ] = None,
    margin: Annotated[
        float,
        typer.Option("--margin", min=0.0, max=1.0, help="Largest lead over the naive baseline."),
    ] = 0.10,
    absolute: Annotated[
        float,
        typer.Option("--absolute", min=0.0, max=1.0, help="Largest mean on a stage row."),
    ] = 0.35,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Write the full report (every episode's items) here."),
    ] = None,
    report_only: Annotated[
        bool,
        typer.Option("--report-only", help="Print the report and exit 0 even when targets break."),
    ] = False,
    explain: Annotated[
        bool,
        typer.Option("--explain", help="For each failing cell, the rubric items that paid."),
    ] = False,
    bank: Annotated[
        Path | None,
        typer.Option("--bank", help="Sample states from this bank (default: the default bank)."),
    ] = None,
    track: Tracks = None,
    workers: EpisodeWorkers = 2,
    backend: Backend = "local",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the state sample.")] = 0,
    quiet: Quiet = False,
) -> None:
    """Play every exploit, the naive baseline and the teacher on stage states and held-out cells.

    Exit 1 when an exploit beats the targets (see --margin, --absolute); 0 otherwise.
    """
    from bat_gym.audits.exploits import exploit_names
    from bat_gym.audits.reward import audit_reward as run_audit
    from bat_gym.core.errors import BatGymError

    unknown = sorted(set(exploit or ()) - set(exploit_names()))
    if unknown:
        raise typer.BadParameter(
            f"{unknown}; choose from {exploit_names()}", param_hint="--exploit"
        )
    try:
        with progress.use(progress.for_cli(quiet)):
            report = run_audit(
                benchmark,
                exploits=exploit or None,
                states=bank,
                states_per_focus=states_per_focus,
                heldout_cells=cells_per_track,
                tracks=tuple(track or ()),
                margin=margin,
                absolute=absolute,
                backend=backend,
                workers=workers,
                seed=seed,
                progress=not quiet,
            )
    except BatGymError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if json_out is not None:
        from bat_gym.core.files import write_atomic

        json_out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(json_out, report.model_dump_json(indent=1) + "\n")
    typer.echo(report.table())
    if explain and report.failures:
        typer.echo(report.explain())
    typer.echo(f"{report.summary()} ({report.wall_s:.0f} s)")
    if not report.ok:
        if report_only:
            typer.echo("report only: exit 0 although the targets are broken")
        else:
            raise typer.Exit(1)
