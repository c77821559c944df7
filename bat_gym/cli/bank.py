"""``bat-gym bank``: build and inspect Stage Banks."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import Backend, BenchmarkName

app = typer.Typer(no_args_is_help=True, help="Build and inspect Stage Banks.")


@app.command("build")
def build(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the bank into.")],
    benchmark: BenchmarkName = None,
    tasks_per_track: Annotated[
        int, typer.Option("--tasks-per-track", min=1, help="Training tasks per track.")
    ] = 1,
    backend: Backend = "local",
    outcome: Annotated[
        list[str] | None,
        typer.Option(
            "--outcome",
            help="Teacher outcome to build (repeatable): success, recovery, failure. "
            "Default: success.",
        ),
    ] = None,
    surrogates: Annotated[
        int,
        typer.Option(
            "--surrogates",
            min=0,
            help="Extra E2E surrogate rows per track: reduced training tasks, kept only when "
            "the teacher's E2E reward reaches the success threshold.",
        ),
    ] = 0,
    surrogate_cases: Annotated[
        int,
        typer.Option("--surrogate-cases", min=1, help="Cases a surrogate task keeps."),
    ] = 1,
    validation_passes: Annotated[
        int,
        typer.Option(
            "--validation-passes",
            min=0,
            help="Pilot runs a surrogate's trajectory may make in the Validate stage.",
        ),
    ] = 1,
    teacher: Annotated[
        str | None,
        typer.Option(
            "--teacher",
            help="A policy to teach with instead of the scripted teacher, as `bat-gym eval "
            "--policy` takes it (e.g. openai:http://127.0.0.1:8000/v1#qwen). The verifier "
            "labels its trajectories success or failure.",
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Tasks built at once, one process each.")
    ] = 1,
) -> None:
    """Run the teacher on training tasks and store every stage's start state.

    Rerunning into the same directory resumes an interrupted build.
    """
    from bat_gym.bank import OUTCOMES, build_bank
    from bat_gym.policies import make_policy
    from bat_gym.registry import get_benchmark

    unknown = sorted(set(outcome or ()) - set(OUTCOMES))
    if unknown:
        raise typer.BadParameter(f"{unknown}; choose from {list(OUTCOMES)}", param_hint="--outcome")
    try:
        policy = make_policy(teacher) if teacher else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--teacher") from None
    start = time.perf_counter()
    try:
        bank = build_bank(
            get_benchmark(benchmark),
            out,
            tasks_per_track=tasks_per_track,
            backend=backend,
            outcomes=tuple(outcome or ("success",)),
            surrogates=surrogates,
            surrogate_cases=surrogate_cases,
            surrogate_validation_passes=validation_passes,
            teacher=policy,
            workers=workers,
        )
    finally:
        if policy is not None:
            policy.close()
    typer.echo(f"built {len(bank)} states in {time.perf_counter() - start:.1f} s -> {out}")
    m = bank.manifest
    if m.get("unsupported_outcomes"):
        why = (
            "a policy is labelled success or failure"
            if policy
            else "the benchmark has no such teacher"
        )
        typer.echo(f"not built ({why}): {m['unsupported_outcomes']}")
    if m.get("labels"):
        typer.echo(f"trajectories labelled by the verifier: {m['labels']}")
    if m.get("rejected"):
        typer.echo(f"rejected: {m['rejected']}")
    if m.get("surrogates"):
        sur = m["surrogates"]
        typer.echo(
            f"surrogates: {sur['kept']} of {sur['planned']} kept; rejected: {sur['rejected']}"
        )


@app.command("show")
def show(path: Annotated[Path, typer.Argument(help="A bank directory.")]) -> None:
    """Summarize a bank: states per focus and track."""
    from bat_gym.bank import StageBank

    bank = StageBank(path)
    typer.echo(
        f"{path}: {len(bank)} states of {bank.manifest['benchmark']} {bank.manifest['version']}"
    )
    counts = Counter((s.focus, s.track, s.outcome) for s in bank)
    for (focus, track, outcome), n in sorted(counts.items()):
        typer.echo(f"  {focus:4} {track:20} {outcome:9} {n}")


@app.command("verify")
def verify(
    path: Annotated[Path, typer.Argument(help="A bank directory.")],
    sample: Annotated[
        int | None,
        typer.Option("--sample", min=1, help="Rows to replay (default: all)."),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="Sandbox backend to replay in.")
    ] = "local",
) -> None:
    """Re-check blobs, snapshot manifests and stage boundaries; exit 1 on any mismatch."""
    from bat_gym.bank import StageBank

    report = StageBank(path).verify(sample=sample, backend=backend)
    typer.echo(report.table())
    if not report.ok:
        raise typer.Exit(1)


@app.command("audit")
def audit(path: Annotated[Path, typer.Argument(help="A bank directory.")]) -> None:
    """Look for held-out content in a bank; exit 1 on any finding."""
    from bat_gym.audit import audit_bank
    from bat_gym.bank import StageBank

    report = audit_bank(StageBank(path))
    typer.echo(report.table())
    if not report.ok:
        raise typer.Exit(1)
