"""The study's PNG charts, drawn with Pillow (the project's one imaging library).

Scores live in [0, 1]; both charts draw that range with grid lines at quarters.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["bar_chart", "line_chart"]

_COLOURS = [
    (70, 110, 180), (200, 120, 50), (90, 160, 90), (180, 70, 70), (130, 100, 170),
    (120, 120, 120), (40, 160, 170),
]  # fmt: skip
_HEIGHT, _MARGIN = 320, 44


def _y(v: float) -> float:
    return _HEIGHT - _MARGIN - v * (_HEIGHT - 2 * _MARGIN)


def _canvas(width: int, title: str):  # type: ignore[no-untyped-def]
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, _HEIGHT), "white")
    draw = ImageDraw.Draw(img)
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        draw.line([(_MARGIN, _y(tick)), (width - 10, _y(tick))], fill=(225, 225, 225))
        draw.text((4, _y(tick) - 6), f"{tick:.2f}", fill="black")
    draw.text((_MARGIN, 8), title, fill="black")
    return img, draw


def bar_chart(
    labels: Sequence[str],
    means: Sequence[float | None],
    intervals: Sequence[tuple[float | None, float | None]],
    path: Path,
    title: str,
) -> None:
    """One bar per label (its mean) with its confidence interval as a black whisker.

    Args:
        labels: bar names, left to right.
        means: bar heights in [0, 1] (None: no bar).
        intervals: ``(low, high)`` per bar (None ends: no whisker).
        path: the PNG to write.
        title: the line above the chart.
    """
    step, bar = 110, 60
    img, draw = _canvas(_MARGIN + 20 + step * max(1, len(labels)), title)
    for i, (label, mean, (low, high)) in enumerate(zip(labels, means, intervals, strict=True)):
        x = _MARGIN + 20 + step * i
        if mean is not None:
            draw.rectangle([x, _y(mean), x + bar, _y(0.0)], fill=_COLOURS[i % len(_COLOURS)])
            draw.text((x, _y(mean) - 14), f"{mean:.3f}", fill="black")
        if low is not None and high is not None:
            mid = x + bar / 2
            draw.line([(mid, _y(low)), (mid, _y(high))], fill="black", width=2)
            for v in (low, high):
                draw.line([(mid - 6, _y(v)), (mid + 6, _y(v))], fill="black", width=2)
        draw.text((x - 4, _HEIGHT - _MARGIN + 6 + 12 * (i % 2)), label[:18], fill="black")
    img.save(path)


def line_chart(
    series: dict[str, Sequence[float | None]], path: Path, title: str, *, x_label: str = "round"
) -> None:
    """One line per series over x = 0, 1, ... (None: a gap), with a legend.

    Args:
        series: name -> values in [0, 1], one per x.
        path: the PNG to write.
        title: the line above the chart.
        x_label: the x axis's name.
    """
    n = max((len(v) for v in series.values()), default=1)
    step = 50
    img, draw = _canvas(_MARGIN + 60 + step * max(1, n) + 150, title)
    for k, (name, values) in enumerate(series.items()):
        colour = _COLOURS[k % len(_COLOURS)]
        points = [(_MARGIN + 30 + step * i, _y(v)) for i, v in enumerate(values) if v is not None]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        legend_x = _MARGIN + 60 + step * max(1, n)
        draw.line([(legend_x, 30 + 14 * k), (legend_x + 16, 30 + 14 * k)], fill=colour, width=3)
        draw.text((legend_x + 20, 24 + 14 * k), name, fill="black")
    for i in range(n):
        draw.text((_MARGIN + 26 + step * i, _HEIGHT - _MARGIN + 6), str(i), fill="black")
    draw.text((_MARGIN + 30 + step * max(0, n - 1), _HEIGHT - 16), x_label, fill="black")
    img.save(path)
