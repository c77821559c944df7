"""BiCuRL: the outer loop that lets a benchmark's held-out evaluation steer training.

One round::

    target    <- select(last gate decision)           weakest stage, or the regressed one
    candidate <- GRPO(incumbent, StageCurriculum(target), steps_per_round)
    A_cand    <- evaluate(candidate)                   aggregates.json only (the firewall)
    decision  <- gate(A_incumbent, A_cand)             paired cells
    if promote: incumbent, A_incumbent <- candidate, A_cand   (best eligible is kept)

Round 0 starts by evaluating the starting checkpoint; its own scores pick the first
target (a self-paired decision: the lowest stage).

The firewall is a process boundary: each evaluation runs as ``bat-gym eval`` in a
child process and the loop reads back nothing but the ``aggregates.json`` it wrote
(:meth:`~bat_gym.evaluation.Aggregates.read`, a type that can hold no task text).

Every phase ends by writing ``loop_state.json`` atomically, so a loop killed at any
point resumes without redoing finished work (a killed GRPO block resumes from its own
checkpoint, a killed evaluation from its finished cells).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bat_gym.core import progress
from bat_gym.core.errors import ConfigError, EvaluationFailed
from bat_gym.core.files import write_atomic
from bat_gym.core.spec import first_problem
from bat_gym.curriculum.gate import GateDecision, GateThresholds, gate
from bat_gym.curriculum.selection import TargetSelector, make_selector
from bat_gym.evaluation.aggregates import Aggregates
from bat_gym.trainers.configs import BiCuRLConfig

__all__ = [
    "BiCuRLConfig",
    "LoopState",
    "RoundRecord",
    "SelectorState",
    "round_seed",
    "run_loop",
    "write_loop_report",
]

STATE_FILE = "loop_state.json"


class RoundRecord(BaseModel):
    """One round of the loop, as ``loop_state.json`` keeps it.

    The GRPO block fills the first four fields; the round's evaluation and gate the
    rest. A field not filled yet is absent from the file (not ``null``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    round: int = Field(ge=0, description="The round's index, 0 first.")
    target: str = Field(description="The stage the round's GRPO block trained on.")
    candidate: str = Field(description="The checkpoint the GRPO block produced.")
    train_s: float = Field(0.0, ge=0, description="Seconds of the GRPO block.")
    eval_s: float | None = Field(None, ge=0, description="Seconds of the candidate's evaluation.")
    eval: str | None = Field(None, description="The candidate's evaluation directory.")
    decision: str | None = Field(None, description="The gate's decision (promote, hold, ...).")
    failed_checks: list[str] | None = Field(None, description="The gate checks that failed.")
    candidate_overall: float | None = Field(None, description="The candidate's overall score.")
    incumbent_overall: float | None = Field(None, description="The incumbent's overall score.")
    candidate_stages: dict[str, float | None] | None = Field(
        None, description="The candidate's score per stage."
    )
    gate: dict[str, Any] | None = Field(None, description="The gate's whole decision.")
    best_overall: float | None = Field(
        None, description="The overall of the checkpoint kept after the gate."
    )
    next_target: str | None = Field(None, description="The stage the selector chose next.")


class SelectorState(BaseModel):
    """A target selector's :meth:`~bat_gym.curriculum.selection.Selector.state_dict`.

    Its ``version`` and ``selector`` name are checked here; the rest is the selector's
    own (counters, estimates), checked by its ``load_state_dict``.
    """

    model_config = ConfigDict(extra="allow")

    version: int = Field(ge=1, description="The selector state's format version.")
    selector: str = Field(min_length=1, description="The selector's name.")


class LoopState(BaseModel):
    """Where the loop stands; written after every phase (``loop_state.json``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    round: int = Field(0, ge=0, description="Rounds finished.")
    phase: Literal["evaluate_start", "train", "evaluate", "done"] = Field(
        "evaluate_start", description="The phase to run next."
    )
    incumbent: str = Field("", description="The best eligible checkpoint so far.")
    incumbent_eval: str = Field("", description="The incumbent's evaluation directory.")
    target: str | None = Field(None, description="The stage the next round trains on.")
    selector: SelectorState | None = Field(None, description="The target selector's state.")
    rounds: list[RoundRecord] = Field(default_factory=list, description="Every round so far.")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="The loop's settings; a resumed loop must match them."
    )
    start_eval_s: float = Field(
        0.0,
        description="Seconds of the starting evaluation; each round records ``train_s`` and "
        "``eval_s`` (a phase interrupted by a kill counts only the invocation that finished it).",
    )

    @property
    def seconds(self) -> float:
        """Seconds of every finished phase together."""
        return self.start_eval_s + sum(r.train_s + (r.eval_s or 0.0) for r in self.rounds)

    def save(self, path: Path) -> None:
        """Write atomically, with the keys of each round filled so far."""
        data = self.model_dump(mode="json")
        data["rounds"] = [r.model_dump(mode="json", exclude_unset=True) for r in self.rounds]
        write_atomic(path, json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> LoopState:
        """Read a state file.

        Raises:
            ConfigError: the file does not parse as a loop state (edited, torn, or
                written by another release), naming the first problem.
        """
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except ValidationError as exc:
            raise ConfigError(
                f"{path} is not a loop state this release can read: {first_problem(exc)}; "
                "restore the file or start the loop in a new output directory"
            ) from exc


def evaluate_checkpoint(model_dir: str, out_dir: Path, cfg: BiCuRLConfig) -> Aggregates:
    """Evaluate a checkpoint in a child process; return only its aggregates.

    Raises:
        RuntimeError: the evaluation failed or left invalid cells (its own report says
            which; the loop does not read it).
    """
    cmd = cfg.evaluation.command(model_dir, str(out_dir))
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        # Only the exit status crosses: the child's output may name tasks.
        raise EvaluationFailed(
            f"the evaluation of {model_dir} exited with status {done.returncode}; see "
            f"{out_dir}/report.md on the evaluation side (status 2: invalid cells, rerun)"
        )
    return Aggregates.read(out_dir / "aggregates.json")


def round_seed(seed: int, round_index: int) -> int:
    """The GRPO seed of round ``round_index`` of a loop seeded ``seed``.

    A round's states and sampling seeds follow from its GRPO seed and target, so one
    seed for every round would train each round with a given target on the same states,
    and a round after a hold that picks the held round's target again would replay it
    exactly (same incumbent, states and samples) and hold again.
    """
    return int(np.random.SeedSequence([seed, round_index]).generate_state(1)[0] >> 1)


def _grpo_block(incumbent: str, target: str, out_dir: Path, cfg: BiCuRLConfig, *, seed: int) -> str:
    from bat_gym.trainers.grpo import train

    return train(cfg.round_grpo(incumbent, target, str(out_dir), seed=seed))["final"]


def run_loop(cfg: BiCuRLConfig) -> LoopState:
    """Run (or resume) the loop; returns the final state. See the module docstring."""
    from bat_gym.catalog import get_benchmark

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / STATE_FILE
    spec = get_benchmark(cfg.benchmark).spec
    selector = make_selector(cfg.selector, spec=spec, seed=cfg.seed)
    thresholds = GateThresholds(**cfg.thresholds)
    state = _open_state(cfg, out, selector)

    def save() -> None:
        state.selector = SelectorState.model_validate(selector.state_dict())
        state.save(state_path)

    if state.phase == "evaluate_start":
        t0 = time.perf_counter()
        start = evaluate_checkpoint(state.incumbent, Path(state.incumbent_eval), cfg)
        state.start_eval_s = time.perf_counter() - t0
        # The starting scores paired with themselves: the paper rule picks the lowest stage.
        state.target = selector.select(gate(start, start, thresholds))
        state.phase = "train"
        save()

    if state.phase == "done" and state.round < cfg.rounds:
        state.phase = "train"  # the loop was extended with more rounds
    # Shown live by bat-gym loop; logged at start and end when used as a library.
    rounds_task = progress.task("BiCuRL rounds", total=cfg.rounds, done=state.round)
    try:
        while state.round < cfg.rounds:
            r = state.round
            if state.phase == "train":
                _train_round(state, cfg, out / "rounds" / f"round-{r:02d}" / "grpo", state_path)
                save()
            if state.phase == "evaluate":
                record = state.rounds[-1]
                decision = _evaluate_round(state, cfg, out / "evals" / f"round-{r:02d}", thresholds)
                state.target = selector.select(decision)
                record.next_target = state.target
                state.round += 1
                state.phase = "train"
                save()
                rounds_task.advance(
                    line=f"round {r} on {record.target}: {decision.decision}, next {state.target}"
                )
    finally:
        rounds_task.close()
    if state.phase != "done":
        state.phase = "done"
        save()
    write_loop_report(state, out)
    return state


def _open_state(cfg: BiCuRLConfig, out: Path, selector: TargetSelector) -> LoopState:
    """The loop's saved state, checked against ``cfg``, or a fresh one written to disk.

    Raises:
        ConfigError: the saved loop ran with other settings (only ``rounds`` may change).
    """
    state_path = out / STATE_FILE
    # Everything but the number of rounds must match to resume: a loop may be extended.
    settings = json.loads(json.dumps({k: v for k, v in cfg.model_dump().items() if k != "rounds"}))
    if state_path.exists():
        state = LoopState.load(state_path)
        # A loop started before chat_template_kwargs existed ran with the template's defaults.
        recorded = {"chat_template_kwargs": {}, **state.settings}
        changed = sorted(k for k in settings if recorded.get(k) != settings[k])
        if changed:
            raise ConfigError(
                f"{out} holds a loop run with other {', '.join(changed)}; rerun with the same "
                "settings to resume it (only --rounds may change), or use a new output directory"
            )
        selector.load_state_dict(state.selector.model_dump() if state.selector else {})
        return state
    state = LoopState(
        incumbent=cfg.model,
        incumbent_eval=str(out / "evals" / "start"),
        selector=SelectorState.model_validate(selector.state_dict()),
        settings=settings,
    )
    state.save(state_path)
    return state


def _train_round(state: LoopState, cfg: BiCuRLConfig, grpo_dir: Path, state_path: Path) -> None:
    """The round's GRPO block from the incumbent on ``state.target``; records the candidate."""
    if state.target is None:
        raise ConfigError(
            f"{state_path} is in the train phase without a target stage; it was "
            "edited or written by another release: start the loop in a new directory"
        )
    t0 = time.perf_counter()
    r = state.round
    candidate = _grpo_block(
        state.incumbent, state.target, grpo_dir, cfg, seed=round_seed(cfg.seed, r)
    )
    state.rounds.append(
        RoundRecord(
            round=r, target=state.target, candidate=candidate, train_s=time.perf_counter() - t0
        )
    )
    state.phase = "evaluate"


def _evaluate_round(
    state: LoopState, cfg: BiCuRLConfig, eval_dir: Path, thresholds: GateThresholds
) -> GateDecision:
    """Evaluate the round's candidate, gate it against the incumbent, keep the winner.

    Returns:
        The gate's decision.
    """
    record = state.rounds[-1]
    t0 = time.perf_counter()
    cand = evaluate_checkpoint(record.candidate, eval_dir, cfg)
    record.eval_s = time.perf_counter() - t0
    base = Aggregates.read(Path(state.incumbent_eval) / "aggregates.json")
    decision = gate(base, cand, thresholds)
    record.eval = str(eval_dir)
    record.decision = decision.decision
    record.failed_checks = [c.name for c in decision.failed]
    record.candidate_overall = cand.overall
    record.incumbent_overall = base.overall
    record.candidate_stages = cand.stages
    record.gate = json.loads(decision.model_dump_json())
    if decision.promoted:
        state.incumbent, state.incumbent_eval = record.candidate, str(eval_dir)
    # The retained checkpoint's overall: not a running maximum, since the gate
    # may promote a candidate up to its overall-drop tolerance below it.
    record.best_overall = cand.overall if decision.promoted else base.overall
    return decision


def write_loop_report(state: LoopState, out: Path) -> None:
    """``report.md`` (each round's target, decision and reasons) and ``rounds.png``."""
    lines = [
        "# BiCuRL run",
        "",
        f"Best eligible checkpoint: `{state.incumbent}`",
        "",
        f"Time: {state.seconds:.0f} s (the starting evaluation, then each round's GRPO block "
        "and evaluation).",
        "",
        "*Retained overall* is the overall of the checkpoint the loop keeps after the "
        "round's gate: the candidate's when promoted, else the incumbent's. It is not a "
        "running maximum: the gate may promote a candidate whose overall is up to "
        "`max_overall_drop` (0.01 by default) below the incumbent's.",
        "",
        "| round | target | candidate overall | retained overall | decision | failed checks "
        "| next | GRPO s | eval s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in state.rounds:
        if rec.decision is None:
            continue
        lines.append(
            f"| {rec.round} | {rec.target} | {_fmt(rec.candidate_overall)} | "
            f"{_fmt(rec.best_overall)} | {rec.decision} | "
            f"{', '.join(rec.failed_checks or ()) or '-'} | {rec.next_target} | "
            f"{rec.train_s:.0f} | {rec.eval_s or 0:.0f} |"
        )
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    scored = [r for r in state.rounds if r.decision is not None]
    _round_curve(
        [r.candidate_overall for r in scored],
        [r.best_overall for r in scored],
        out / "rounds.png",
    )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _round_curve(raw: Sequence[float | None], best: Sequence[float | None], path: Path) -> None:
    """Raw candidate overall per round (blue) and the retained checkpoint's (orange), 0..1."""
    from PIL import Image, ImageDraw

    width, height, margin = 120 + 60 * max(1, len(raw)), 300, 40
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)

    def xy(i: int, v: float) -> tuple[float, float]:
        return margin + 30 + 60 * i, height - margin - v * (height - 2 * margin)

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = xy(0, tick)[1]
        draw.line([(margin, y), (width - 10, y)], fill=(225, 225, 225))
        draw.text((4, y - 6), f"{tick:.2f}", fill="black")
    for series, colour in ((raw, (70, 110, 180)), (best, (200, 120, 50))):
        points = [xy(i, v) for i, v in enumerate(series) if v is not None]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
    for i in range(len(raw)):
        draw.text((xy(i, 0)[0] - 4, height - margin + 6), str(i), fill="black")
    draw.text((margin, 8), "overall: candidate (blue), retained (orange)", fill="black")
    draw.text((width - 44, height - 16), "round", fill="black")
    img.save(path)
