"""The arms of the paper's comparison, and what one unit (arm x seed) of each runs.

=====================  ===========  ==========================================
arm                    starts from  what it runs
=====================  ===========  ==========================================
``baseline``           random init  nothing: the untrained model, evaluated
``sft``                SFT          nothing more: the shared SFT checkpoint
``grpo-e2e``           SFT          GRPO on E2E rows only (one final reward)
``bicurl``             SFT          BiCuRL rounds, pools S-target/S-mix/E2E 1/2, 1/4, 1/4
``bicurl-no-target``   SFT          the same without the S-target pool
``bicurl-no-mix``      SFT          the same without the S-mix pool
``bicurl-no-e2e``      SFT          the same without the E2E pool
=====================  ===========  ==========================================

Every RL arm starts from the same SFT checkpoint and stops at the same number of
generated tokens (:attr:`~bat_gym.trainers.configs.GRPOConfig.max_generated_tokens`);
a dropped pool's share goes to the others in proportion to theirs. Each unit ends
with a held-out evaluation of its final checkpoint (:func:`held_out`), sampling seed
``FINAL_EVAL_SEED + seed``: the same cells for every arm.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bat_gym.trainers.study.config import StudyConfig

__all__ = [
    "ARMS",
    "Arm",
    "bicurl_config",
    "composition",
    "cpu_seconds",
    "grpo_config",
    "held_out",
    "run_arm_unit",
]

FINAL_EVAL_SEED = 10_000
"""Added to a unit's seed for its final evaluation's sampling. BiCuRL's gate evaluates
with the unit's seed itself; sampling the final evaluation otherwise keeps the
promoted checkpoint from being scored on the very episodes that promoted it."""

PAPER_MIX = (0.5, 0.25, 0.25)
"""BaT's pool proportions: S-target, S-mix, E2E."""


@dataclass(frozen=True)
class Arm:
    """One arm: what it starts from, how it trains, and its pool mix."""

    name: str
    kind: Literal["eval", "grpo", "bicurl"]
    start: Literal["init", "sft"]
    mix: tuple[float, float, float] | None = None
    """Shares of the S-target, S-mix and E2E pools (None: no training)."""
    label: str = ""


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("baseline", "eval", "init", label="Baseline (no training)"),
        Arm("sft", "eval", "sft", label="SFT"),
        Arm("grpo-e2e", "grpo", "sft", (0.0, 0.0, 1.0), "GRPO E2E-only"),
        Arm("bicurl", "bicurl", "sft", PAPER_MIX, "BiCuRL (three-pool mix)"),
        Arm("bicurl-no-target", "bicurl", "sft", (0.0, 0.25, 0.25), "BiCuRL without S-target"),
        Arm("bicurl-no-mix", "bicurl", "sft", (0.5, 0.0, 0.25), "BiCuRL without S-mix"),
        Arm("bicurl-no-e2e", "bicurl", "sft", (0.5, 0.25, 0.0), "BiCuRL without E2E"),
    )
}


def composition(mix: tuple[float, float, float], batch: int) -> dict[str, int]:
    """Rows per pool in a batch of ``batch`` states.

    ``mix`` is renormalised and rounded by largest remainder, so the counts add up to
    ``batch`` (ties go to the earlier pool).

    >>> composition((0.5, 0.25, 0.25), 8)
    {'target_per_batch': 4, 'mix_per_batch': 2, 'e2e_per_batch': 2}
    >>> composition((0.5, 0.0, 0.25), 4)
    {'target_per_batch': 3, 'mix_per_batch': 0, 'e2e_per_batch': 1}
    """
    total = sum(mix)
    exact = [batch * m / total for m in mix]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(3), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: batch - sum(counts)]:
        counts[i] += 1
    return dict(zip(("target_per_batch", "mix_per_batch", "e2e_per_batch"), counts, strict=True))


# --------------------------------------------------------------------------- evaluation


def held_out(model: str | Path, out: Path, study: StudyConfig, seed: int) -> dict[str, Any]:
    """Evaluate ``model`` on the benchmark's held-out cells (resumes from finished cells).

    Returns:
        The unit's evaluation figures: overall, task, stages, finish counts, each
        track's per-episode overall scores (for the study's bootstrap) and the
        95% bootstrap CI of this one evaluation.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.evaluation import EvalConfig, evaluate_spec

    bench = get_benchmark(study.benchmark)
    cfg = EvalConfig(
        repeats=study.eval_repeats,
        workers=study.eval_workers,
        progress=False,
        budgets=bench.spec.budgets.model_copy(update={"max_turns": study.max_turns}),
    )
    report = evaluate_spec(
        bench,
        f"{study.eval_policy}:{model}",
        out,
        cfg,
        max_new_tokens=study.max_new_tokens,
        temperature=study.temperature,
        seed=seed,
        max_batch_size=study.eval_workers,
    )
    agg, ci = report.aggregates, report.intervals["overall"]
    per_track: dict[str, list[float]] = {}
    for cell in report.cells:
        if cell.valid and cell.overall is not None:
            per_track.setdefault(cell.cell.track, []).append(cell.overall)
    return {
        "overall": agg.overall,
        "task": agg.task,
        "stages": agg.stages,
        "episodes": agg.completion.runs,
        "finished": agg.completion.finished,
        "finish_rate": agg.completion.finished / max(1, agg.completion.valid),
        "overall_by_track": per_track,
        "overall_ci": [ci.low, ci.high],
        "eval_s": float(report.manifest["timing"]["wall_s"]),
    }


# --------------------------------------------------------------------------- training


def _grpo_settings(study: StudyConfig, arm: Arm) -> dict[str, Any]:
    """The GRPO fields every run of ``arm`` shares (study sizes, the arm's pools)."""
    if arm.mix is None:
        raise ValueError(f"arm {arm.name} does not train; it has no GRPO settings")
    return {
        "lr": 1e-4,
        "warmup_steps": 4,
        "kl_coef": 0.006,
        "num_envs": 8,  # episodes at once (one sandbox each), as measured in the learnability runs
        "micro_batch_size": 8,
        "device": "cpu",
        "save_every": 1,  # a killed unit resumes from its last step
        "keep_last": 1,
        **study.grpo,
        "benchmark": study.benchmark,
        "groups_per_step": study.groups_per_step,
        "group_size": study.group_size,
        "temperature": study.temperature,
        "max_new_tokens": study.max_new_tokens,
        "max_turns": study.max_turns,
        "curriculum": {
            "batch_size": study.groups_per_step,
            **composition(arm.mix, study.groups_per_step),
        },
    }


def _generated_tokens(run_dir: Path) -> tuple[float, int]:
    """Generated tokens and optimizer steps of every GRPO run under ``run_dir``."""
    tokens, steps = 0.0, 0
    for log in sorted(run_dir.rglob("metrics.jsonl")):
        for line in log.read_text(encoding="utf-8").splitlines():
            tokens += json.loads(line).get("generated_tokens", 0.0)
            steps += 1
    return tokens, steps


def grpo_config(study: StudyConfig, arm: Arm, sft: Path, bank: Path, out: Path, seed: int) -> Any:
    """The :class:`~bat_gym.trainers.configs.GRPOConfig` of a GRPO arm's unit."""
    from bat_gym.trainers.configs import GRPOConfig

    settings = _grpo_settings(study, arm)
    steps = study.max_steps_per_round * study.rounds  # a cap: the token budget ends the run
    settings.update(
        model=str(sft),
        output_dir=str(out),
        bank=str(bank),
        # A curriculum needs a target stage; with no S-target or S-mix rows it draws none.
        target="S1",
        steps=steps,
        warmup_steps=min(settings["warmup_steps"], steps),
        max_generated_tokens=study.token_budget,
        seed=seed,
    )
    return GRPOConfig(**settings)


def bicurl_config(study: StudyConfig, arm: Arm, sft: Path, bank: Path, out: Path, seed: int) -> Any:
    """The :class:`~bat_gym.trainers.configs.BiCuRLConfig` of a BiCuRL-type arm's unit."""
    from bat_gym.trainers.configs import BiCuRLConfig

    grpo = {**_grpo_settings(study, arm), "max_generated_tokens": study.round_tokens}
    grpo.pop("benchmark")
    grpo["warmup_steps"] = min(grpo["warmup_steps"], study.max_steps_per_round)
    return BiCuRLConfig(
        model=str(sft),
        output_dir=str(out),
        benchmark=study.benchmark,
        bank=str(bank),
        rounds=study.rounds,
        steps_per_round=study.max_steps_per_round,
        eval_repeats=study.round_eval_repeats or study.eval_repeats,
        eval_workers=study.eval_workers,
        eval_max_turns=study.max_turns,
        eval_max_new_tokens=study.max_new_tokens,
        eval_temperature=study.temperature,
        eval_policy=study.eval_policy,
        selector=study.selector,
        grpo=grpo,
        seed=seed,
    )


def _share_start_evaluation(out: Path) -> None:
    """Copy a sibling BiCuRL arm's finished start evaluation (same seed) into ``out``.

    Every BiCuRL-type arm of a seed starts by evaluating the same SFT checkpoint on the
    same cells with the same sampling seed; the evaluation resumes from finished cells,
    so with the sibling's cells in place it plays no episode again (its identity check
    still refuses cells made with other settings).
    """
    start = out / "evals" / "start"
    if start.exists():
        return
    units, seed = out.parents[2], out.parent.name
    for sibling in sorted(units.glob(f"bicurl*/{seed}/train/evals/start")):
        if (sibling / "aggregates.json").is_file():
            shutil.copytree(sibling, start)
            return


def _train_bicurl(
    study: StudyConfig, arm: Arm, sft: Path, bank: Path, out: Path, seed: int
) -> tuple[str, list[dict[str, Any]]]:
    from bat_gym.trainers.bicurl import run_loop

    cfg = bicurl_config(study, arm, sft, bank, out, seed)
    _share_start_evaluation(out)
    state = run_loop(cfg)
    rounds = [
        {
            "round": r.round,
            "target": r.target,
            "decision": r.decision,
            "raw_overall": r.candidate_overall,
            "retained_overall": r.best_overall,
            "stages": r.candidate_stages,
        }
        for r in state.rounds
        if r.decision is not None
    ]
    return state.incumbent, rounds


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (user + system).

    On a shared machine wall time measures the neighbours as much as the work; CPU
    time does not, and over two cores an idle machine's wall time is about half of it.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_arm_unit(
    study: StudyConfig, arm: Arm, seed: int, unit_dir: Path, *, init: Path, sft: Path, bank: Path
) -> dict[str, Any]:
    """Train (if the arm trains) and evaluate one unit; its metrics.

    Args:
        study: the study's settings.
        arm: the arm.
        seed: the unit's seed (training and evaluation sampling).
        unit_dir: the unit's folder; training goes to ``train/``, the evaluation to
            ``eval/``, both resumable.
        init: the random-init model.
        sft: the shared SFT checkpoint every RL arm starts from.
        bank: the Stage Bank the RL arms draw their states from.
    """
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    rounds: list[dict[str, Any]] = []
    if arm.kind == "eval":
        final = str(init if arm.start == "init" else sft)
    elif arm.kind == "grpo":
        from bat_gym.trainers.grpo import train

        cfg = grpo_config(study, arm, sft, bank, unit_dir / "train", seed)
        final = str(train(cfg)["final"])
    else:
        final, rounds = _train_bicurl(study, arm, sft, bank, unit_dir / "train", seed)
    train_s = time.perf_counter() - t0
    tokens, steps = _generated_tokens(unit_dir / "train")
    evaluation = held_out(final, unit_dir / "eval", study, FINAL_EVAL_SEED + seed)
    return {
        "arm": arm.name,
        "seed": seed,
        "checkpoint": final,
        "generated_tokens": tokens,
        "grpo_steps": steps,
        "rounds": rounds,
        "train_s": train_s,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": cpu_seconds() - cpu0,
        **evaluation,
    }
