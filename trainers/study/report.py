"""The study's report: results per arm with bootstrap CIs, the comparisons, the plots.

Reads the finished units of a study folder (nothing else), so it can be rebuilt at any
time (``bat-gym study report DIR``), also while units are still running. Writes
``results.json``, ``results.md``, ``overall.png`` (held-out Overall per arm with 95%
CIs), ``bicurl_rounds.png`` (BiCuRL's raw and retained overall per round) and
``bicurl_stages.png`` (its candidates' stage scores per round).

The interval of an arm is a two-level bootstrap: seeds are drawn with replacement,
then each drawn seed's episodes are drawn with replacement within each track (tracks
stay the units, as in :func:`bat_gym.evaluation.bootstrap_interval`); each draw's
figure is the mean over drawn seeds of the mean of track means. A difference of two
arms is the difference of independent draws of each.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bat_gym.core.files import write_atomic
from bat_gym.trainers.study.arms import ARMS
from bat_gym.trainers.study.plots import bar_chart, line_chart
from bat_gym.trainers.study.units import DONE_FILE, METRICS_FILE

__all__ = ["COMPARISONS", "arm_draws", "read_units", "summarize", "write_report"]

RESAMPLES = 2000
LEVEL = 0.95

COMPARISONS = (
    ("bicurl", "grpo-e2e"),
    ("bicurl", "bicurl-no-target"),
    ("bicurl", "bicurl-no-mix"),
    ("bicurl", "bicurl-no-e2e"),
    ("sft", "baseline"),
)
"""(arm, against): the paper's claims as differences of held-out Overall."""


def read_units(out: Path) -> dict[str, list[dict[str, Any]]]:
    """The finished units' metrics by arm, seeds in order (arms in the study's order)."""
    units: dict[str, list[dict[str, Any]]] = {}
    for done in sorted((out / "units").glob(f"*/seed-*/{DONE_FILE}")):
        metrics = json.loads((done.parent / METRICS_FILE).read_text(encoding="utf-8"))
        units.setdefault(metrics["arm"], []).append(metrics)
    order = [a for a in ARMS if a in units]
    return {a: sorted(units[a], key=lambda m: m["seed"]) for a in order}


def arm_draws(units: list[dict[str, Any]], rng: np.random.Generator) -> np.ndarray | None:
    """Bootstrap draws of an arm's held-out Overall -> ``(RESAMPLES,)`` (see the module).

    Units without a scored episode are left out; None when no unit has one.
    """
    units = [u for u in units if any(u["overall_by_track"].values())]
    if not units:
        return None
    # per_seed[s] -> (RESAMPLES,): seed s's mean of track means in each draw
    per_seed = []
    for unit in units:
        tracks = [np.asarray(v) for v in unit["overall_by_track"].values() if v]
        draws = [t[rng.integers(0, len(t), size=(RESAMPLES, len(t)))].mean(axis=1) for t in tracks]
        per_seed.append(np.mean(np.stack(draws), axis=0))
    stacked = np.stack(per_seed)  # (seeds, RESAMPLES)
    chosen = rng.integers(0, len(units), size=(RESAMPLES, len(units)))  # seeds per draw
    return stacked[chosen, np.arange(RESAMPLES)[:, None]].mean(axis=1)


def _quantiles(draws: np.ndarray | None) -> list[float | None]:
    if draws is None:
        return [None, None]
    low, high = np.quantile(draws, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(low), float(high)]


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _arm_row(name: str, units: list[dict[str, Any]], draws: np.ndarray | None) -> dict[str, Any]:
    stages = sorted({s for u in units for s in u["stages"]})
    return {
        "label": ARMS[name].label,
        "seeds": [u["seed"] for u in units],
        "overall": _mean([u["overall"] for u in units]),
        "overall_ci": _quantiles(draws),
        "overall_per_seed": [u["overall"] for u in units],
        "task": _mean([u["task"] for u in units]),
        "stages": {s: _mean([u["stages"].get(s) for u in units]) for s in stages},
        "finish_rate": _mean([u["finish_rate"] for u in units]),
        "generated_tokens": _mean([u["generated_tokens"] for u in units]),
        "grpo_steps": _mean([u["grpo_steps"] for u in units]),
        "wall_s": _mean([u["wall_s"] for u in units]),
        "cpu_s": _mean([u.get("cpu_s") for u in units]),
    }


def _rounds(units: list[dict[str, Any]]) -> dict[str, Any]:
    """BiCuRL's per-round curves, mean over seeds, and how far retention ever fell."""
    n = max((len(u["rounds"]) for u in units), default=0)

    def at(r: int, key: str) -> float | None:
        return _mean([u["rounds"][r][key] for u in units if len(u["rounds"]) > r])

    stages = sorted({s for u in units for r in u["rounds"] for s in (r["stages"] or {})})
    # The largest fall of the retained overall below its best so far, over seeds and rounds.
    fall = 0.0
    for u in units:
        best = -1.0
        for r in u["rounds"]:
            if r["retained_overall"] is not None:
                best = max(best, r["retained_overall"])
                fall = max(fall, best - r["retained_overall"])
    return {
        "raw_overall": [at(r, "raw_overall") for r in range(n)],
        "retained_overall": [at(r, "retained_overall") for r in range(n)],
        "stages": {
            s: [
                _mean(
                    [(u["rounds"][r]["stages"] or {}).get(s) for u in units if len(u["rounds"]) > r]
                )
                for r in range(n)
            ]
            for s in stages
        },  # fmt: skip
        "targets_seed0": [r["target"] for r in units[0]["rounds"]] if units else [],
        "decisions_seed0": [r["decision"] for r in units[0]["rounds"]] if units else [],
        "retained_max_fall": fall,
    }


def summarize(out: Path) -> dict[str, Any]:
    """The study's results from its finished units (``results.json``'s content)."""
    units = read_units(out)
    rng = np.random.default_rng(0)
    draws = {a: arm_draws(us, rng) for a, us in units.items()}
    study = json.loads((out / "study.json").read_text(encoding="utf-8"))
    comparisons = {}
    for arm, other in COMPARISONS:
        a, b = draws.get(arm), draws.get(other)
        if a is not None and b is not None:
            low, high = _quantiles(a - b)
            comparisons[f"{arm} - {other}"] = {
                "difference": float(
                    _mean([u["overall"] for u in units[arm]])
                    - _mean([u["overall"] for u in units[other]])
                ),
                "ci": [low, high],
                "excludes_zero": low > 0 or high < 0,
            }
    sft = out / "units" / "sft-train" / METRICS_FILE
    return {
        "study": study["name"],
        "sft_train": json.loads(sft.read_text(encoding="utf-8")) if sft.is_file() else None,
        "benchmark": study["benchmark"],
        "token_budget": study["token_budget"],
        "arms": {a: _arm_row(a, us, draws[a]) for a, us in units.items()},
        "comparisons": comparisons,
        "bicurl_rounds": _rounds(units["bicurl"]) if "bicurl" in units else None,
        "level": LEVEL,
    }


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _sft_line(sft: dict[str, Any] | None) -> str:
    if sft is None:
        return "The shared SFT run has not finished."
    cpu = f", {sft['cpu_s']:.0f} CPU s" if sft.get("cpu_s") is not None else ""
    return f"The shared set-up and SFT run took {sft['wall_s']:.0f} s{cpu}."


def _markdown(res: dict[str, Any]) -> str:
    stages = sorted({s for row in res["arms"].values() for s in row["stages"]})
    lines = [
        f"# Study {res['study']} ({res['benchmark']})",
        "",
        f"Held-out Overall per arm, mean over seeds, with its {res['level']:.0%} bootstrap CI "
        f"(seeds, then episodes within tracks). Every RL arm starts from the same SFT "
        f"checkpoint with a budget of {res['token_budget']} generated tokens per seed.",
        "",
        _sft_line(res.get("sft_train")),
        "",
        "| arm | seeds | Overall | CI | task | "
        + " | ".join(stages)
        + " | finish rate | gen. tokens | GRPO steps | wall s/unit | CPU s/unit |",
        "|---|---|---|---|---|" + "---|" * len(stages) + "---|---|---|---|---|",
    ]
    for row in res["arms"].values():
        low, high = row["overall_ci"]
        lines.append(
            f"| {row['label']} | {len(row['seeds'])} | {_fmt(row['overall'])} | "
            f"[{_fmt(low)}, {_fmt(high)}] | {_fmt(row['task'])} | "
            + " | ".join(_fmt(row["stages"].get(s)) for s in stages)
            + f" | {_fmt(row['finish_rate'], 2)} | {_fmt(row['generated_tokens'], 0)} | "
            f"{_fmt(row['grpo_steps'], 1)} | {_fmt(row['wall_s'], 0)} | {_fmt(row['cpu_s'], 0)} |"
        )
    if res["comparisons"]:
        lines += ["", "| comparison | difference | CI | CI excludes 0 |", "|---|---|---|---|"]
        for name, c in res["comparisons"].items():
            lines.append(
                f"| {name} | {c['difference']:+.3f} | [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | "
                f"{'yes' if c['excludes_zero'] else 'no'} |"
            )
    rounds = res["bicurl_rounds"]
    if rounds and rounds["raw_overall"]:
        lines += [
            "",
            "BiCuRL per round (mean over seeds; target and decision of seed 0); the retained "
            f"overall fell at most {rounds['retained_max_fall']:.3f} below its best so far.",
            "",
            "| round | target | decision | raw overall | retained overall |",
            "|---|---|---|---|---|",
        ]
        for r, (raw, kept) in enumerate(
            zip(rounds["raw_overall"], rounds["retained_overall"], strict=True)
        ):
            target = rounds["targets_seed0"][r] if r < len(rounds["targets_seed0"]) else "-"
            decision = rounds["decisions_seed0"][r] if r < len(rounds["decisions_seed0"]) else "-"
            lines.append(f"| {r} | {target} | {decision} | {_fmt(raw)} | {_fmt(kept)} |")
        lines += ["", "![BiCuRL rounds](bicurl_rounds.png)", "", "![stages](bicurl_stages.png)"]
    lines += ["", "![held-out Overall per arm](overall.png)", ""]
    return "\n".join(lines)


def write_report(out: str | Path) -> dict[str, Any]:
    """Write ``results.json``, ``results.md`` and the PNGs into ``out``; the results."""
    out = Path(out)
    res = summarize(out)
    write_atomic(out / "results.json", json.dumps(res, indent=1) + "\n")
    write_atomic(out / "results.md", _markdown(res))
    arms = res["arms"]
    bar_chart(
        list(arms),
        [row["overall"] for row in arms.values()],
        [tuple(row["overall_ci"]) for row in arms.values()],
        out / "overall.png",
        f"held-out Overall per arm, {res['level']:.0%} CI ({res['study']})",
    )
    rounds = res["bicurl_rounds"]
    if rounds and rounds["raw_overall"]:
        line_chart(
            {"raw": rounds["raw_overall"], "retained": rounds["retained_overall"]},
            out / "bicurl_rounds.png",
            "BiCuRL overall per round: raw candidate, retained checkpoint",
        )
        line_chart(rounds["stages"], out / "bicurl_stages.png", "BiCuRL candidate stage scores")
    return res
