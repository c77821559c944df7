"""HTML building blocks of the viewer: escaping, the page shell, charts, code and diffs.

Every string that came from a run (agent messages, tool output, file contents, paths)
goes through :func:`h` before it reaches a page: a hostile policy's output is shown,
never run. Pages link only to files beside them (relative names), so the same pages
work served and opened from disk.
"""

from __future__ import annotations

import difflib
import functools
import html
from collections.abc import Sequence
from typing import Any

__all__ = [
    "bar_chart",
    "diff_html",
    "fmt",
    "h",
    "highlight",
    "line_chart",
    "page",
    "pill",
    "stage_pill",
    "warm_highlighter",
]


def h(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too, so it is safe in attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def fmt(x: float | None, digits: int = 3) -> str:
    """A score for a table: ``-`` for None."""
    return "-" if x is None else f"{x:.{digits}f}"


def pill(passed: bool | None, text: str | None = None) -> str:
    """A pass / fail / null badge."""
    cls, word = {True: ("pass", "pass"), False: ("fail", "fail"), None: ("null", "null")}[passed]
    return f'<span class="pill {cls}">{h(text or word)}</span>'


def stage_pill(stage: str | None) -> str:
    """A badge in the stage's colour."""
    s = stage or "E2E"
    return f'<span class="pill stage" style="background:var(--{h(s)},#7f7f7f)">{h(s)}</span>'


def page(title: str, body: str, *, crumbs: Sequence[tuple[str, str]] = ()) -> str:
    """A whole page: header with breadcrumbs, the stylesheet and script beside it."""
    nav = " / ".join(f'<a href="{h(href)}">{h(text)}</a>' for text, href in crumbs)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)} - bat-gym view</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="viewer.css"><script src="viewer.js" defer></script>'
        f'</head><body><header class="top"><h1>{h(title)}</h1><nav>{nav}</nav></header>'
        f"<main>{body}</main></body></html>\n"
    )


@functools.lru_cache(maxsize=32)
def _highlighter(language: str) -> Any:
    """(lexer, formatter) for a language, built once: a formatter builds its style table."""
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_by_name({"sh": "bash"}.get(language, language))
    except ClassNotFound:
        lexer = get_lexer_by_name("text")
    return lexer, HtmlFormatter(nowrap=True)


#: Code past this many characters is shown plain: highlighting is for reading, and a
#: generated megabyte script would only slow the page.
MAX_HIGHLIGHT_CHARS = 20_000


def warm_highlighter() -> None:
    """Load the highlighters of the languages tool calls use (bash, python)."""
    for language in ("bash", "python"):
        highlight("x = 1", language)


def highlight(code: str, language: str | None) -> str:
    """Code as highlighted HTML (Pygments, when the language is known), in a ``<pre>``."""
    inner = None
    if len(code) <= MAX_HIGHLIGHT_CHARS:
        try:
            from pygments import highlight as pyg

            lexer, formatter = _highlighter(language or "text")
            inner = pyg(code, lexer, formatter)
        except ImportError:  # Pygments comes with rich; without it, plain text
            pass
    return f'<pre class="hl">{h(code) if inner is None else inner}</pre>'


def diff_html(before: str | None, after: str, name: str) -> str:
    """A unified diff from ``before`` to ``after`` (the whole file as added when new)."""
    a = [] if before is None else before.splitlines()
    b = after.splitlines()
    lines = list(difflib.unified_diff(a, b, f"a/{name}", f"b/{name}", lineterm="", n=3))
    if not lines:
        return '<p class="muted">unchanged</p>'
    out = []
    for line in lines[2:]:
        cls = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")
        out.append(f'<span class="{cls}">{h(line) or " "}</span>' if cls else h(line) + "\n")
    return f'<pre class="diff">{"".join(out)}</pre>'


def bar_chart(bars: Sequence[tuple[str, float | None, float | None, float | None]]) -> str:
    """Vertical bars in [0, 1] with interval whiskers, as inline SVG.

    Args:
        bars: ``(label, value, low, high)`` each; None values draw no bar.
    """
    w, top, bottom, step = 60 + 64 * len(bars), 14, 170, 64
    parts = [f'<svg width="{w}" height="200" role="img" aria-label="stage scores">']
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = bottom - t * (bottom - top)
        parts.append(f'<line x1="40" x2="{w - 6}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6ea"/>')
        parts.append(f'<text x="4" y="{y + 4:.1f}">{t:.2f}</text>')
    for i, (label, v, low, high) in enumerate(bars):
        x = 50 + step * i
        colour = f"var(--{h(label)},#c87832)" if label.startswith("S") else "#c87832"
        if v is not None:
            y = bottom - v * (bottom - top)
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="40" height="{bottom - y:.1f}" '
                f'style="fill:{colour}"><title>{h(label)} {v:.3f}</title></rect>'
            )
            parts.append(f'<text x="{x + 2}" y="{y - 3:.1f}">{v:.2f}</text>')
            if low is not None and high is not None:
                y0, y1 = bottom - low * (bottom - top), bottom - high * (bottom - top)
                parts.append(
                    f'<line x1="{x + 20}" x2="{x + 20}" y1="{y0:.1f}" y2="{y1:.1f}" '
                    'stroke="#222" stroke-width="2"/>'
                )
        parts.append(f'<text x="{x + 6}" y="{bottom + 16}">{h(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    series: dict[str, Sequence[tuple[float, float | None]]],
    *,
    links: dict[float, str] | None = None,
    width: int = 760,
    height: int = 220,
    y_label: str = "",
) -> str:
    """Lines over x, as inline SVG; points of the first series link where ``links`` says.

    Args:
        series: name -> ``(x, y)`` points; None y values are gaps.
        links: x -> href for the markers of the first series.
        width: pixels.
        height: pixels.
        y_label: what the y axis shows (the chart's accessible name).
    """
    colours = ["#2f6fdd", "#e15759", "#59a14f", "#b07aa1", "#f28e2b", "#76b7b2"]
    pts = [(x, y) for s in series.values() for x, y in s if y is not None]
    if not pts:
        return '<p class="muted">nothing to plot yet</p>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(1.0, max(p[1] for p in pts))
    left, right, top, bottom = 46, width - 10, 10, height - 26

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * (right - left)

    def sy(y: float) -> float:
        return bottom - (y - y0) / ((y1 - y0) or 1) * (bottom - top)

    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="{h(y_label)}">']
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        parts.append(
            f'<line x1="{left}" x2="{right}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#e3e6ea"/>'
        )
        parts.append(f'<text x="2" y="{sy(y) + 4:.1f}">{y:.2f}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}">{x0:g}</text>')
    parts.append(f'<text x="{right - 30}" y="{height - 6}">{x1:g}</text>')
    for n, (name, pts_) in enumerate(series.items()):
        c = colours[n % len(colours)]
        path = " ".join(
            f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
            for i, (x, y) in enumerate(p for p in pts_ if p[1] is not None)
        )
        parts.append(f'<path d="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        if n == 0 and len(pts_) <= 400:
            for x, y in pts_:
                if y is None:
                    continue
                dot = f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{c}"><title>{x:g}: {y:.3f}</title></circle>'
                href = (links or {}).get(x)
                parts.append(f'<a href="{h(href)}">{dot}</a>' if href else dot)
        parts.append(
            f'<text x="{right - 150}" y="{top + 12 + 14 * n}" style="fill:{c}">{h(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
