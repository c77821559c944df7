"""Options several commands take, declared once: the same flag reads the same everywhere.

Each is an ``Annotated`` type for a typer parameter; give it a default as usual
(``backend: Backend = "local"``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from bat_gym.core.sandbox import BACKENDS

__all__ = [
    "Backend",
    "BenchmarkName",
    "ChatTemplateKwargs",
    "EpisodeWorkers",
    "MaxNewTokens",
    "Quiet",
    "Temperature",
    "Tracks",
    "build_policy",
    "parse_chat_template_kwargs",
    "policy_options",
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


MaxNewTokens = Annotated[
    int | None,
    typer.Option("--max-new-tokens", min=1, help="Tokens per turn (hf, vllm, openai)."),
]
Temperature = Annotated[
    float | None,
    typer.Option("--temperature", min=0.0, help="Sampling temperature (hf, vllm, openai)."),
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


def policy_options(
    spec: str,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    chat_template_kwargs: str | None = None,
) -> dict[str, Any]:
    """The sampling options given for ``--policy SPEC``, checked against its kind.

    Raises:
        typer.BadParameter: an unknown kind, or sampling options for a policy that does
            not sample (a scripted one).
    """
    from bat_gym.policies import policy_kind

    options = {
        k: v
        for k, v in {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "chat_template_kwargs": parse_chat_template_kwargs(chat_template_kwargs) or None,
        }.items()
        if v is not None
    }
    try:
        kind = policy_kind(spec)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
    if options and not kind.sampling:
        raise typer.BadParameter(
            f"{sorted(options)} apply to model policies, not {spec!r}: {kind.description}",
            param_hint="--policy",
        )
    return options


def build_policy(spec: str, options: dict[str, Any]) -> Any:
    """``make_policy(spec, **options)``; a spec its kind cannot take is a bad ``--policy``.

    Raises:
        typer.BadParameter: naming the form to write.
    """
    from bat_gym.policies import make_policy

    try:
        return make_policy(spec, **options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
