"""``bat-gym gate``: promote or hold a candidate checkpoint, and pick the next target.

Reads only the two runs' ``aggregates.json`` (the firewall type), so it can run on the
training side. Exit status, for scripts that branch on it:

===== ==========================================================================
0     promote: the candidate becomes the next round's starting checkpoint
1     hold: some check failed; keep the baseline, discard the candidate
2     usage error (an unknown option, a threshold out of range)
3     catastrophic: the overall score dropped by the catastrophic bound or more
4     refused: an input is unreadable, has invalid cells, or the runs are unpaired
===== ==========================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bat_gym.curriculum.selection import SELECTORS

__all__ = ["gate", "EXIT_CODES"]

#: Exit status per outcome (see the module docstring).
EXIT_CODES: dict[str, int] = {"promote": 0, "hold": 1, "catastrophic": 3, "refused": 4}


def _aggregates_path(path: Path) -> Path:
    return path / "aggregates.json" if path.is_dir() else path


def _default(field: str) -> float:
    from bat_gym.curriculum.gate import GateThresholds

    return GateThresholds.model_fields[field].default


def gate(
    baseline: Annotated[
        Path,
        typer.Argument(help="The incumbent's evaluation directory, or its aggregates.json."),
    ],
    candidate: Annotated[
        Path,
        typer.Argument(help="The candidate's evaluation directory, or its aggregates.json."),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the decision and target as JSON.")
    ] = False,
    max_overall_drop: Annotated[
        float,
        typer.Option("--max-overall-drop", min=0.0, max=1.0, help="Largest overall drop."),
    ] = _default("max_overall_drop"),
    max_task_drop: Annotated[
        float, typer.Option("--max-task-drop", min=0.0, max=1.0, help="Largest task drop.")
    ] = _default("max_task_drop"),
    max_track_drop: Annotated[
        float,
        typer.Option(
            "--max-track-drop", min=0.0, max=1.0, help="Largest drop of any track's overall."
        ),
    ] = _default("max_track_drop"),
    max_stage_drop: Annotated[
        float,
        typer.Option(
            "--max-stage-drop", min=0.0, max=1.0, help="Largest drop of any guarded stage."
        ),
    ] = _default("max_stage_drop"),
    guarded_stages: Annotated[
        str,
        typer.Option(
            "--guarded-stages",
            help="Comma-separated stages held to --max-stage-drop ('' guards none).",
        ),
    ] = "S3,S4,S5",
    catastrophic_drop: Annotated[
        float,
        typer.Option(
            "--catastrophic-drop",
            min=0.0,
            max=1.0,
            help="An overall drop this large or larger is catastrophic.",
        ),
    ] = _default("catastrophic_drop"),
    selector: Annotated[
        str,
        typer.Option("--selector", help=f"Target selector: {', '.join(SELECTORS)}."),
    ] = "paper",
    selector_state: Annotated[
        Path | None,
        typer.Option(
            "--selector-state",
            help="JSON file the selector resumes from (if present) and is saved to; "
            "lets the 'progress' selector learn across rounds.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the 'progress' selector.")] = 0,
    benchmark: Annotated[
        str | None,
        typer.Option(
            "--benchmark",
            help="Benchmark whose spec a selector reads, as deficit reads its stage weights "
            "(default: the default one).",
        ),
    ] = None,
) -> None:
    """Gate CANDIDATE against BASELINE on paired cells; print every check and the target.

    Exit 0 promote, 1 hold, 3 catastrophic, 4 refused (2: usage error).
    """
    from pydantic import ValidationError

    from bat_gym.core.errors import BatGymError
    from bat_gym.core.files import write_atomic
    from bat_gym.curriculum.gate import GateThresholds
    from bat_gym.curriculum.gate import gate as decide
    from bat_gym.curriculum.selection import NoTargetStage, make_selector
    from bat_gym.evaluation.aggregates import Aggregates

    try:
        selector = SELECTORS.resolve(selector)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--selector") from None
    try:
        thresholds = GateThresholds(
            max_overall_drop=max_overall_drop,
            max_task_drop=max_task_drop,
            max_track_drop=max_track_drop,
            max_stage_drop=max_stage_drop,
            guarded_stages=tuple(s.strip() for s in guarded_stages.split(",") if s.strip()),
            catastrophic_drop=catastrophic_drop,
        )
    except ValidationError as exc:
        problems = "; ".join(e["msg"] for e in exc.errors())
        raise typer.BadParameter(problems, param_hint="thresholds") from None

    try:
        decision = decide(
            Aggregates.read(_aggregates_path(baseline)),
            Aggregates.read(_aggregates_path(candidate)),
            thresholds,
        )
    except BatGymError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_CODES["refused"]) from None

    spec = None
    if SELECTORS[selector].needs_spec:
        from bat_gym.catalog import get_benchmark

        spec = get_benchmark(benchmark).spec
    chooser = make_selector(selector, spec=spec, seed=seed)
    if selector_state is not None and selector_state.exists():
        chooser.load_state_dict(json.loads(selector_state.read_text(encoding="utf-8")))
    try:
        target: str | None = chooser.select(decision)
        why = None
    except NoTargetStage as exc:
        target, why = None, str(exc)
    if selector_state is not None:
        write_atomic(selector_state, json.dumps(chooser.state_dict(), indent=2) + "\n")

    if as_json:
        payload = {
            "gate": decision.model_dump(mode="json"),
            "selector": selector,
            "target": target,
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(decision.table())
        stages = ", ".join(
            f"{s} {_fmt(decision.baseline_stages[s])}->{_fmt(decision.candidate_stages[s])}"
            for s in decision.regressions
        )
        typer.echo(f"stages (baseline->candidate): {stages or 'none'}")
        typer.echo(f"next target ({selector}): {target or 'none: ' + str(why)}")
    raise typer.Exit(EXIT_CODES[decision.decision])


def _fmt(x: float | None) -> str:
    return "null" if x is None else f"{x:.4f}"
