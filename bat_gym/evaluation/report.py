"""The evaluation side's report: per-track table, bootstrap intervals, a stage bar chart.

Everything here may name tasks and hold notes: it stays with the evaluation. Training
reads :mod:`bat_gym.evaluation.aggregates` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from bat_gym.evaluation.aggregates import Aggregates
from bat_gym.evaluation.cells import CellResult

__all__ = ["Interval", "EvalReport", "bootstrap_interval", "write_markdown", "write_stage_chart"]


class Interval(BaseModel):
    """A point estimate with a bootstrap confidence interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: float | None
    low: float | None
    high: float | None
    level: float


class EvalReport(BaseModel):
    """Everything one evaluation found (evaluation side only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest: dict[str, Any]
    aggregates: Aggregates
    intervals: dict[str, Interval]
    cells: tuple[CellResult, ...]


def bootstrap_interval(
    results: Sequence[CellResult],
    metric: str,
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap of the mean of track means, resampling repeats within tracks.

    Tracks are the units and stay fixed; each resample draws every track's valid,
    scored repeats with replacement (a stratified bootstrap), recomputes
    ``mean_t mean_r x_{t,r}`` and the interval is the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles over ``resamples`` draws.

    Args:
        results: cell results.
        metric: ``"overall"``, ``"task"``, ``"agentic"`` or a stage id (``"S3"``).
        resamples: bootstrap draws.
        level: coverage, e.g. 0.95.
        seed: the resampling seed (same seed, same interval).
    """
    by_track: dict[str, list[float]] = {}
    for r in results:
        value = r.stages.get(metric) if metric.startswith("S") else getattr(r, metric)
        if r.valid and value is not None:
            by_track.setdefault(r.cell.track, []).append(float(value))
    if not by_track:
        return Interval(mean=None, low=None, high=None, level=level)
    rng = np.random.default_rng(seed)
    point = float(np.mean([np.mean(v) for v in by_track.values()]))
    # draws[t] -> (resamples,): the track's mean in each bootstrap draw
    draws = [
        np.asarray(v)[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
        for v in by_track.values()
    ]
    means = np.mean(np.stack(draws), axis=0)  # (resamples,)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(mean=point, low=float(low), high=float(high), level=level)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def write_markdown(report: EvalReport, path: Path, *, chart: str | None) -> None:
    """A human-readable report: headline with intervals, per-track and per-tier tables, invalid cells."""
    agg, man = report.aggregates, report.manifest
    stages = list(agg.stages)
    lines = [
        f"# {man['benchmark']['name']} evaluation: {man['policy'].get('name', man['policy'])}",
        "",
        f"{agg.completion.runs} runs ({agg.completion.valid} valid, {agg.completion.invalid} "
        f"invalid, {agg.completion.finished} finished) in {man['timing']['wall_s']:.0f} s.",
        "",
        "| metric | mean | 95% CI |",
        "|---|---|---|",
    ]
    for name, iv in report.intervals.items():
        lines.append(f"| {name} | {_fmt(iv.mean)} | [{_fmt(iv.low)}, {_fmt(iv.high)}] |")
    lines += [
        "",
        "## Per track (mean over repeats)",
        "",
        "| track | runs | overall | task | " + " | ".join(stages) + " |",
        "|---|---|---|---|" + "---|" * len(stages),
    ]
    for track, t in agg.tracks.items():
        cells = " | ".join(_fmt(t.stages[s]) for s in stages)
        lines.append(
            f"| {track} | {t.completion.valid}/{t.completion.runs} | {_fmt(t.overall)} | "
            f"{_fmt(t.task)} | {cells} |"
        )
    cells_line = " | ".join(_fmt(agg.stages[s]) for s in stages)
    lines.append(
        f"| **mean of tracks** | | {_fmt(agg.overall)} | {_fmt(agg.task)} | {cells_line} |"
    )
    for tier, ta in agg.tiers.items():
        lines += [
            "",
            f"## Tier {tier} (mean over its repeats per track, then over tracks)",
            "",
            "| track | runs | overall | task | " + " | ".join(stages) + " |",
            "|---|---|---|---|" + "---|" * len(stages),
        ]
        for track, t in ta.tracks.items():
            cells = " | ".join(_fmt(t.stages.get(s)) for s in stages)
            lines.append(
                f"| {track} | {t.completion.valid}/{t.completion.runs} | {_fmt(t.overall)} | "
                f"{_fmt(t.task)} | {cells} |"
            )
        cells_line = " | ".join(_fmt(ta.stages.get(s)) for s in stages)
        lines.append(
            f"| **mean of tracks** | | {_fmt(ta.overall)} | {_fmt(ta.task)} | {cells_line} |"
        )
    if chart:
        lines += ["", f"![stage scores]({chart})"]
    failures = {k: v for k, v in agg.failures.items() if v}
    if failures:
        lines += ["", "## Failure categories", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(failures.items(), key=lambda kv: -kv[1])]
    invalid = [c for c in report.cells if not c.valid]
    if invalid:
        lines += ["", "## Invalid cells (infrastructure; not scored, rerun to retry)", ""]
        lines += [f"- {c.cell.key}: {(c.error or '').splitlines()[0]}" for c in invalid]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_stage_chart(agg: Aggregates, intervals: dict[str, Interval], path: Path) -> None:
    """A PNG bar chart of the aggregate stage scores (and task, overall) with their CIs."""
    from PIL import Image, ImageDraw

    names = [*agg.stages, "task", "overall"]
    width, height, margin, bar = 80 + 70 * len(names), 320, 40, 40
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    top, bottom = margin, height - margin

    def y(v: float) -> float:
        return bottom - v * (bottom - top)

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        draw.line([(margin, y(tick)), (width - 10, y(tick))], fill=(225, 225, 225))
        draw.text((4, y(tick) - 6), f"{tick:.2f}", fill="black")
    for i, name in enumerate(names):
        x = margin + 20 + 70 * i
        iv = intervals.get(name)
        value = iv.mean if iv is not None else None
        colour = (70, 110, 180) if name.startswith("S") else (200, 120, 50)
        if value is not None:
            draw.rectangle([x, y(value), x + bar, bottom], fill=colour)
            if iv is not None and iv.low is not None and iv.high is not None:
                mid = x + bar / 2
                draw.line([(mid, y(iv.low)), (mid, y(iv.high))], fill="black", width=2)
            draw.text((x, y(value) - 14), f"{value:.2f}", fill="black")
        draw.text((x + 4, bottom + 6), name, fill="black")
    img.save(path)
