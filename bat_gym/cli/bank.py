"""``bat-gym bank``: build, inspect and explain Stage Banks."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from bat_gym.cli.options import Backend, BenchmarkName, Quiet
from bat_gym.core import progress

app = typer.Typer(no_args_is_help=True, help="Build and inspect Stage Banks.")


@app.command("build")
def build(
    out: Annotated[
        Path | None, typer.Option("--out", help="Directory to write the bank into.")
    ] = None,
    default: Annotated[
        bool,
        typer.Option(
            "--default",
            help="Build the whole default grid into bat_gym's cache (what envs without "
            "states= read; otherwise each trajectory is built on first use).",
        ),
    ] = False,
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
    quiet: Quiet = False,
) -> None:
    """Run the teacher on training tasks and store every stage's start state.

    Rerunning into the same directory resumes an interrupted build. Exits 1 when a
    track is left without states for some focus, with the teacher's verdict for each
    rejected task.
    """
    from bat_gym.bank import OUTCOMES, build_bank
    from bat_gym.catalog import get_benchmark
    from bat_gym.policies import make_policy

    if default:
        given = [
            flag
            for flag, value in (
                ("--out", out is not None),
                ("--outcome", bool(outcome)),
                ("--tasks-per-track", tasks_per_track != 1),
                ("--surrogates", surrogates != 0),
                ("--teacher", teacher is not None),
                ("--backend", backend != "local"),
            )
            if value
        ]
        if given:
            raise typer.BadParameter(
                f"--default builds the benchmark's default grid as it is; drop {', '.join(given)}",
                param_hint="--default",
            )
        with progress.use(progress.for_cli(quiet)):
            _build_default(get_benchmark(benchmark), workers)
        return
    if out is None:
        raise typer.BadParameter("give the bank directory (or --default)", param_hint="--out")
    unknown = sorted(set(outcome or ()) - set(OUTCOMES))
    if unknown:
        raise typer.BadParameter(f"{unknown}; choose from {list(OUTCOMES)}", param_hint="--outcome")
    try:
        policy = make_policy(teacher) if teacher else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--teacher") from None
    start = time.perf_counter()
    bench = get_benchmark(benchmark)
    try:
        with progress.use(progress.for_cli(quiet)):
            bank = build_bank(
                bench,
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
    _echo_shares(m.get("admission", {}).get("shares", {}))
    if m.get("surrogates"):
        sur = m["surrogates"]
        typer.echo(
            f"surrogates: {sur['kept']} of {sur['planned']} kept; rejected: {sur['rejected']}"
        )
    _fail_on_gaps(bench, bank, out)


def _echo_shares(shares: dict[str, Any]) -> None:
    """Print the share of candidate rows admitted, per focus and outcome."""
    from bat_gym.bank.explain import share_lines

    for line in share_lines(shares):
        typer.echo(line)


def _fail_on_gaps(bench: Any, bank: Any, out: Path) -> None:
    """Exit 1 when a track is left without states for a focus, showing every rejection."""
    from bat_gym.bank.explain import explain, gaps, journal_records

    empty = gaps(bench, bank, bank.info.tracks)
    if not empty:
        return
    for line in explain(journal_records(out)):
        typer.echo(line)
    cells = ", ".join(f"{f}/{t}" for f, t in empty)
    typer.secho(
        f"error: no states for {len(empty)} focus/track cell(s): {cells}; every trajectory "
        "that could fill them was rejected (verdicts above; `bat-gym bank explain "
        f"{out} --all` shows every task). Fix the teacher, or build only what it can teach.",
        fg=typer.colors.RED,
        err=True,
    )
    raise typer.Exit(1)


def _build_default(bench: Any, workers: int) -> None:
    from bat_gym.bank import default_states

    source = default_states(bench)
    start = time.perf_counter()
    bank = source.complete(workers=workers)
    typer.echo(
        f"{bench.name} default grid: {len(bank)} states in {time.perf_counter() - start:.1f} s "
        f"-> {source.root}"
    )
    _echo_shares(bank.manifest.get("admission", {}).get("shares", {}))


@app.command("explain")
def explain_cmd(
    path: Annotated[
        Path | None, typer.Argument(help="A bank directory (its build journal is read).")
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="The default states' trajectories instead.")
    ] = False,
    benchmark: BenchmarkName = None,
    task: Annotated[
        list[str] | None,
        typer.Option("--task", help="Only tasks whose key contains this (repeatable)."),
    ] = None,
    all_tasks: Annotated[
        bool, typer.Option("--all", help="Kept tasks too, not only rejected ones.")
    ] = False,
) -> None:
    """Show the teacher's verdict for a bank's tasks: why each was kept or rejected.

    First the share of candidate rows admitted per focus and outcome (a row is admitted
    when a demonstration played from it wins it). For each task: the rejection reason,
    the reward, task score and evidence completeness, each stage's credit, and every
    rubric item that fell short with its detail and evidence; rows the admission gates
    refused, with the gate's finding; rows no demonstration won, with its reward.
    """
    from bat_gym.bank.explain import explain, journal_records

    if default == (path is not None):
        raise typer.BadParameter("give a bank directory or --default (one of them)")
    if default:
        from bat_gym.bank import default_states
        from bat_gym.catalog import get_benchmark

        source = default_states(get_benchmark(benchmark))
        records = source.records()
        pending = sum(len(r.get("pending", [])) for r in records.values())
        where = (
            f"{source.root} ({len(records)} of {len(source.trajectories)} trajectories built"
            f"{f', {pending} rows not demonstrated yet' if pending else ''})"
        )
    else:
        assert path is not None
        records = journal_records(path)
        where = f"{path} ({len(records)} tasks)"
    from bat_gym.bank.explain import admission_shares

    lines = explain(records, tasks=task or (), all_tasks=all_tasks)
    typer.echo(where)
    _echo_shares(admission_shares(records.values()))
    for line in lines or ["no rejected task or refused row (--all shows every task)"]:
        typer.echo(line)


@app.command("show")
def show(path: Annotated[Path, typer.Argument(help="A bank directory.")]) -> None:
    """Summarize a bank: states per focus and track."""
    from bat_gym.bank import StageBank

    bank = StageBank(path)
    typer.echo(f"{path}: {len(bank)} states of {bank.info.benchmark} {bank.info.version}")
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
    """Re-check blobs, snapshots, stage boundaries and demonstrations; exit 1 on any finding.

    Each row's stored demonstration is played again from the row and scored by its
    contract; one that no longer reaches the admission bar is a finding.
    """
    from bat_gym.bank import StageBank

    report = StageBank(path).verify(sample=sample, backend=backend)
    typer.echo(report.table())
    if not report.ok:
        raise typer.Exit(1)


@app.command("audit")
def audit(
    path: Annotated[Path, typer.Argument(help="A bank directory.")], quiet: Quiet = False
) -> None:
    """Look for held-out content in a bank; exit 1 on any finding."""
    from bat_gym.audits.leakage import audit_bank
    from bat_gym.bank import StageBank

    with progress.use(progress.for_cli(quiet)):
        report = audit_bank(StageBank(path))
    typer.echo(report.table())
    if not report.ok:
        raise typer.Exit(1)
