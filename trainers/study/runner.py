"""``run_study``: the shared set-up, the SFT checkpoint, then every arm x seed, in order.

Layout of a study's folder::

    study.json                 the study's settings (what ran)
    setup/                     bank, random-init tiny model and tokenizer, SFT export
    units/sft-train/           the cold-start SFT run every RL arm starts from
    units/<arm>/seed-<n>/      one unit per arm and seed (:mod:`.units`)
    results.json results.md *.png   the report (:mod:`.report`), rewritten after each unit

Units run one after another; each is cached and resumable, so a study runs in pieces
(kill it, rerun the same command) and two processes can share the work.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bat_gym.core.errors import ConfigError
from bat_gym.core.files import write_atomic
from bat_gym.trainers.study.arms import ARMS, composition, cpu_seconds, run_arm_unit
from bat_gym.trainers.study.config import StudyConfig
from bat_gym.trainers.study.units import Unit, UnitOutcome, run_unit

__all__ = ["check_pools", "run_study", "sft_unit", "unit_dir"]

log = logging.getLogger(__name__)

_WAIT_S = 30.0
"""Seconds between looks at a unit another process holds (the shared SFT run)."""


def unit_dir(out: Path, arm: str, seed: int) -> Path:
    """The folder of the unit ``arm`` x ``seed`` under the study folder ``out``."""
    return out / "units" / arm / f"seed-{seed}"


# Fields an untrained arm's unit does not depend on: changing them keeps its result.
_TRAINING_FIELDS = frozenset(
    {"token_budget", "groups_per_step", "group_size", "rounds", "max_steps_per_round",
     "selector", "round_eval_repeats", "grpo"}
)  # fmt: skip


def check_pools(study: StudyConfig) -> None:
    """Refuse a batch too small to hold every pool an arm keeps.

    Raises:
        ConfigError: ``groups_per_step`` rounds one of an arm's pools to no rows.
    """
    for name in study.arms:
        arm = ARMS[name]
        if arm.mix is None:
            continue
        counts = composition(arm.mix, study.groups_per_step)
        empty = [pool for pool, share, n in zip(counts, arm.mix, counts.values(), strict=True)
                 if share > 0 and n == 0]  # fmt: skip
        if empty:
            raise ConfigError(
                f"groups_per_step={study.groups_per_step} leaves arm {name} with no "
                f"{', '.join(empty)} rows ({counts}); give groups_per_step >= 4"
            )


# Fields a unit records only when they are set: units run before they existed (the
# tiny model, served by transformers) keep their settings.
_RECORDED_WHEN_SET = ("base_model", "sft", "eval_policy")


def _set_fields(study: StudyConfig, names: tuple[str, ...]) -> dict[str, Any]:
    """``names``' values in ``study``, those at their defaults left out."""
    fields = StudyConfig.model_fields
    return {
        n: getattr(study, n)
        for n in names
        if getattr(study, n) != fields[n].get_default(call_default_factory=True)
    }


def _unit_settings(study: StudyConfig, arm: str, seed: int) -> dict[str, Any]:
    """What a unit's result depends on (its ``unit.json``)."""
    skip = {"arms", "seeds", "quick", "name", *_RECORDED_WHEN_SET}
    if ARMS[arm].kind == "eval":
        skip |= _TRAINING_FIELDS
    settings = {"arm": arm, "seed": seed, **study.model_dump(exclude=skip)}
    return settings | _set_fields(study, _RECORDED_WHEN_SET)


def sft_unit(study: StudyConfig, out: Path) -> Unit:
    """The unit of the shared SFT run: what it depends on, where it lives."""
    settings = {
        "benchmark": study.benchmark,
        "tasks_per_track": study.tasks_per_track,
        "sft_steps": study.sft_steps,
        **_set_fields(study, ("base_model", "sft")),
    }
    return Unit(out / "units" / "sft-train", settings)


def _setup(study: StudyConfig, out: Path) -> Any:
    """The bank, the model SFT starts from and its SFT export, under ``out/setup``."""
    from bat_gym.trainers.tiny_sft import build_tiny_setup

    return build_tiny_setup(
        out / "setup",
        study.benchmark,
        tasks_per_track=study.tasks_per_track,
        base_model=study.base_model,
    )


def _sft_unit(study: StudyConfig, out: Path) -> Path:
    """The shared SFT checkpoint (a unit of its own); its final folder."""
    from bat_gym.trainers.sft import train
    from bat_gym.trainers.tiny_sft import tiny_sft_config

    unit = sft_unit(study, out)

    def work(path: Path) -> dict[str, Any]:
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        setup = _setup(study, out)
        # Checkpointed every 25 steps, so a killed SFT run resumes (the recipe saves none).
        cfg = tiny_sft_config(
            setup, path / "run", steps=study.sft_steps, **{"save_every": 25, **study.sft}
        )
        final = Path(train(cfg)["final_dir"])
        return {
            "checkpoint": str(final),
            "wall_s": time.perf_counter() - t0,
            "cpu_s": cpu_seconds() - cpu0,
        }

    # Every arm needs the checkpoint: a second process waits for the first to train it.
    while run_unit(unit, work) == "busy":
        log.info("%s: another process trains the SFT checkpoint; waiting", unit.path)
        time.sleep(_WAIT_S)
    return Path(unit.metrics()["checkpoint"])


def run_study(
    study: StudyConfig,
    out: str | Path,
    *,
    on_unit: Callable[[str, int, UnitOutcome, float], None] | None = None,
) -> dict[str, UnitOutcome]:
    """Run (or resume) every unit of ``study`` under ``out``; write the report after each.

    Args:
        study: the study's settings.
        out: the study folder (created; rerun into it to resume).
        on_unit: called after each unit with ``(arm, seed, outcome, seconds)``.

    Returns:
        Each unit's outcome by ``"<arm>/seed-<n>"``: ``ran``, ``skipped`` (finished
        before) or ``busy`` (another process works on it).
    """
    from bat_gym.trainers.study.report import write_report

    check_pools(study)
    study.check_base_model()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # BiCuRL evaluates in child processes; they read the study's cache too.
    os.environ.setdefault("BAT_GYM_CACHE", str(out.resolve() / "cache"))
    write_atomic(out / "study.json", study.model_dump_json(indent=1) + "\n")
    sft = _sft_unit(study, out)
    setup = _setup(study, out)
    bank = Path(setup.bank.root)
    outcomes: dict[str, UnitOutcome] = {}
    for name in study.arms:
        arm = ARMS[name]
        for seed in study.seed_list:
            unit = Unit(unit_dir(out, name, seed), _unit_settings(study, name, seed))
            t0 = time.perf_counter()
            outcome = run_unit(
                unit,
                lambda path, arm=arm, seed=seed: run_arm_unit(
                    study, arm, seed, path, init=setup.init, sft=sft, bank=bank
                ),
            )
            outcomes[f"{name}/seed-{seed}"] = outcome
            seconds = time.perf_counter() - t0
            log.info("unit %s seed %d: %s in %.0f s", name, seed, outcome, seconds)
            if on_unit is not None:
                on_unit(name, seed, outcome, seconds)
            if outcome == "ran":
                write_report(out)
    write_report(out)
    write_atomic(out / "outcomes.json", json.dumps(outcomes, indent=1) + "\n")
    return outcomes
