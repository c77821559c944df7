"""Command-line options derived from the run configs' fields: one source.

Each field of :class:`~bat_gym.trainers.configs.GRPOConfig`,
:class:`~bat_gym.trainers.configs.SFTConfig` and
:class:`~bat_gym.trainers.configs.BiCuRLConfig` becomes one option: its name
(``max_new_tokens`` -> ``--max-new-tokens``), its default and its help (the docstring
under the field) come from the config, so a new field is on the command line with no
second copy of its default or help to drift. The configs import no torch, so they are
read by importing them.

Field types map to options as follows: ``int``/``float``/``str``/``bool`` as such (a
bool is ``--flag/--no-flag``); ``X | None`` as ``X`` with ``None`` as "not given";
``Literal[...]`` as a string checked against its values; ``tuple[str, ...]`` as a
repeatable option; ``dict[...]`` as a JSON object.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from bat_gym.core.errors import ConfigError

__all__ = [
    "ConfigField",
    "config_command",
    "config_fields",
    "config_values",
    "field_option",
    "to_config",
]

_SCALARS: dict[type, str] = {int: "int", float: "float", str: "str", bool: "bool"}


@dataclass(frozen=True)
class ConfigField:
    """One config field, as the command line sees it.

    Attributes:
        name: the field's name (``max_new_tokens``).
        kind: ``int``, ``float``, ``str``, ``bool``, ``choice``, ``list`` (a tuple of
            strings) or ``json`` (a dict).
        default: the config's default (``{}``/``()`` for a default factory);
            :data:`inspect.Parameter.empty` when the field is required.
        help: the docstring under the field, whitespace collapsed and reST roles
            reduced to their text.
        optional: the type admits ``None``.
        choices: the allowed values of a ``choice`` field.
    """

    name: str
    kind: str
    default: Any
    help: str
    optional: bool = False
    choices: tuple[str, ...] = ()

    @property
    def required(self) -> bool:
        """Whether the config has no default for the field."""
        return self.default is inspect.Parameter.empty

    @property
    def flag(self) -> str:
        """The option's name: ``--`` and the field's name with dashes."""
        return "--" + self.name.replace("_", "-")


def _kind(config: str, name: str, annotation: Any) -> tuple[str, bool, tuple[str, ...]]:
    """``(kind, optional, choices)`` of a field's type."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _kind(config, name, get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) != 1:
            raise ConfigError(f"{config}.{name}: a field of type {annotation} has no option")
        kind, _, choices = _kind(config, name, rest[0])
        return kind, True, choices
    if annotation in _SCALARS:
        return _SCALARS[annotation], False, ()
    if origin is Literal:
        return "choice", False, tuple(str(v) for v in get_args(annotation))
    if origin is tuple:
        return "list", False, ()
    if origin is dict:
        return "json", False, ()
    raise ConfigError(f"{config}.{name}: a field of type {annotation} has no option")


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    if info.default is PydanticUndefined:
        return inspect.Parameter.empty
    return info.default


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def _clean(doc: str) -> str:
    """A docstring as one line of option help: reST roles to their last name, no ``."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return " ".join(text.replace("``", "").split())


@cache
def config_fields(config: type[BaseModel]) -> tuple[ConfigField, ...]:
    """The fields of a run config, in order, as options.

    Raises:
        ConfigError: a field has a type no option maps to.
    """
    return tuple(
        ConfigField(
            name=name,
            kind=(kind := _kind(config.__name__, name, info.annotation))[0],
            default=_default(info),
            help=_clean(info.description or ""),
            optional=kind[1],
            choices=kind[2],
        )
        for name, info in config.model_fields.items()
    )


def _cli_default(f: ConfigField) -> Any:
    """The option's default: the config's, as the option spells it."""
    if f.required:
        return inspect.Parameter.empty
    if f.kind == "json":
        return None if not f.default else json.dumps(f.default)
    if f.kind == "list":
        return None if not f.default else list(f.default)
    return f.default


def to_config(f: ConfigField, value: Any) -> Any:
    """An option's value as the config field takes it (a JSON object to a dict, ...)."""
    if f.kind == "json":
        if value is None:
            return None if f.optional else {}
        return value if isinstance(value, dict) else _json_object(f.flag, value)
    if f.kind == "list":
        return tuple(value or ())
    return value


_EXAMPLE = """'{"enable_thinking": false}'"""


def _json_object(flag: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"{text!r} is not JSON ({exc}); write an object, e.g. {_EXAMPLE}", param_hint=flag
        ) from exc
    if not isinstance(value, dict):
        raise typer.BadParameter(
            f"{text!r} is not a JSON object; write one, e.g. {_EXAMPLE}", param_hint=flag
        )
    return value


def _choice_check(choices: tuple[str, ...]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"use one of {', '.join(choices)}")
        return value

    return check


def _json_check(flag: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        return None if value is None else _json_object(flag, value)

    return check


def field_option(
    f: ConfigField,
    *,
    names: Sequence[str] = (),
    default: Any = inspect.Parameter.empty,
    help: str | None = None,  # noqa: A002 - typer's own name for it
    name: str | None = None,
) -> inspect.Parameter:
    """The typer parameter of one config field.

    Args:
        f: the field.
        names: more names of the option (older spellings kept working).
        default: a default other than the config's (only where the command computes
            the config's value itself; say so in ``help``).
        help: help other than the field's docstring.
        name: the parameter's name (default: the field's).
    """
    option_default = _cli_default(f) if default is inspect.Parameter.empty else default
    if f.kind == "bool":
        flags: tuple[str, ...] = (f"{f.flag}/--no-{f.flag[2:]}", *names)
    else:
        flags = (f.flag, *names)
    text = f.help if help is None else help
    base: Any = {
        "int": int,
        "float": float,
        "str": str,
        "bool": bool,
        "choice": str,
        "json": str,
        "list": list[str],
    }[f.kind]
    nullable = f.optional or f.kind in ("json", "list") or option_default is None
    callback = None
    metavar = None
    if f.kind == "choice":
        text = f"{text} One of: {', '.join(f.choices)}.".strip()
        callback = _choice_check(f.choices)
    elif f.kind == "json":
        metavar = "JSON"
        callback = _json_check(f.flag)
    option = typer.Option(*flags, help=text, callback=callback, metavar=metavar)
    annotation = Annotated[base | None if nullable else base, option]  # type: ignore[operator]
    return inspect.Parameter(
        name or f.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=option_default,
        annotation=annotation,
    )


def config_command(
    params: Sequence[inspect.Parameter], body: Callable[[dict[str, Any]], None], *, doc: str
) -> Callable[..., None]:
    """A typer command taking ``params`` that hands ``body`` the values by name."""

    def command(**values: Any) -> None:
        body(values)

    command.__signature__ = inspect.Signature(list(params))  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc
    return command


def config_values(
    fields: Sequence[ConfigField], values: Mapping[str, Any], *, skip: Sequence[str] = ()
) -> dict[str, Any]:
    """The config's keyword arguments from a command's option values."""
    return {f.name: to_config(f, values[f.name]) for f in fields if f.name not in skip}
