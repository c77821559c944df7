"""Options several commands take, declared once: the same flag reads the same everywhere.

Each is an ``Annotated`` type for a typer parameter; give it a default as usual
(``backend: Backend = "local"``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from bat_gym.sandbox import BACKENDS

__all__ = [
    "Backend",
    "BenchmarkName",
    "ChatTemplateKwargs",
    "EpisodeWorkers",
    "Quiet",
    "Tracks",
    "parse_chat_template_kwargs",
]

BenchmarkName = Annotated[
    str | None,
    typer.Option("--benchmark", help="Benchmark name (default: the default benchmark)."),
]
Backend = Annotated[str, typer.Option("--backend", help=f"Sandbox backend: {', '.join(BACKENDS)}.")]
EpisodeWorkers = Annotated[
    int, typer.Option("--workers", min=1, help="Episodes played at once, one sandbox each.")
]
Tracks = Annotated[
    list[str] | None,
    typer.Option("--track", help="Only this track (repeatable). Default: all."),
]
ChatTemplateKwargs = Annotated[
    str | None,
    typer.Option(
        "--chat-template-kwargs",
        metavar="JSON",
        help="Extra chat template arguments, a JSON object, e.g. "
        "'{\"enable_thinking\": false}' for Qwen3. Give training and evaluation the same.",
    ),
]


_EXAMPLE = """'{"enable_thinking": false}'"""


def parse_chat_template_kwargs(text: str | None) -> dict[str, Any]:
    """The ``--chat-template-kwargs`` value as a dict ({} when not given).

    Raises:
        typer.BadParameter: the value is not a JSON object.
    """
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"{text!r} is not JSON ({exc}); write an object, e.g. {_EXAMPLE}",
            param_hint="--chat-template-kwargs",
        ) from exc
    if not isinstance(value, dict):
        raise typer.BadParameter(
            f"{text!r} is not a JSON object; write one, e.g. {_EXAMPLE}",
            param_hint="--chat-template-kwargs",
        )
    return value


Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        help="No progress display (it is off anyway when stdout is not a terminal).",
    ),
]
