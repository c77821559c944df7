"""Command-line options derived from the trainers' config dataclasses: one source.

Each field of :class:`~bat_gym.trainers.grpo.GRPOConfig`, :class:`~bat_gym.trainers.sft.
SFTConfig` and :class:`~bat_gym.trainers.bicurl.BiCuRLConfig` becomes one option: its
name (``max_new_tokens`` -> ``--max-new-tokens``), its default and its help (the
docstring under the field) come from the config, so a new field is on the command line
with no second copy of its default or help to drift.

The configs are read from their source (:mod:`ast`), never imported: the command line
is built for every ``bat-gym`` command, and the trainer modules import torch.

Field types map to options as follows: ``int``/``float``/``str``/``bool`` as such (a
bool is ``--flag/--no-flag``); ``X | None`` as ``X`` with ``None`` as "not given";
``Literal[...]`` (or a module-level alias of one) as a string checked against its
values; ``tuple[str, ...]`` as a repeatable option; ``dict[...]`` as a JSON object.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import typer

from bat_gym.errors import ConfigError
from bat_gym.pyparse import parse

__all__ = [
    "ConfigField",
    "config_command",
    "config_fields",
    "config_values",
    "field_option",
    "to_config",
]

_SCALARS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


@dataclass(frozen=True)
class ConfigField:
    """One config field, as read from the config's source.

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


@cache
def _module_tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ConfigError(f"cannot find the source of {module}; reinstall bat-gym")
    with open(spec.origin, encoding="utf-8") as fh:
        return parse(fh.read(), filename=spec.origin)


def _alias(module: str, name: str) -> ast.expr:
    """The right-hand side of ``name = ...`` in ``module``, followed through its imports."""
    tree = _module_tree(module)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.value
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and node.value is not None
        ):
            return node.value
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and any((a.asname or a.name) == name for a in node.names)
        ):
            return _alias(node.module, name)
    raise ConfigError(f"{module}: cannot resolve the type {name!r} of a config field")


def _kind(module: str, node: ast.expr) -> tuple[str, bool, tuple[str, ...]]:
    """``(kind, optional, choices)`` of a field's annotation."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [node.left, node.right]
        rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        if len(rest) != 1:
            raise ConfigError(f"{module}: a config field of type {ast.unparse(node)} has no option")
        kind, _, choices = _kind(module, rest[0])
        return kind, True, choices
    if isinstance(node, ast.Name):
        if node.id in _SCALARS:
            return node.id, False, ()
        return _kind(module, _alias(module, node.id))
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        outer = node.value.id
        if outer == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return "choice", False, tuple(str(ast.literal_eval(i)) for i in items)
        if outer == "tuple":
            return "list", False, ()
        if outer == "dict":
            return "json", False, ()
    raise ConfigError(f"{module}: a config field of type {ast.unparse(node)} has no option")


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return inspect.Parameter.empty
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        for kw in node.keywords:
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Name):
                return {"dict": {}, "tuple": (), "list": []}[kw.value.id]
            if kw.arg == "default":
                return ast.literal_eval(kw.value)
        raise ConfigError(f"cannot read the default {ast.unparse(node)} of a config field")
    return ast.literal_eval(node)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def _clean(doc: str) -> str:
    """A docstring as one line of option help: reST roles to their last name, no ``."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return " ".join(text.replace("``", "").split())


@cache
def config_fields(module: str, name: str) -> tuple[ConfigField, ...]:
    """The fields of dataclass ``name`` in ``module``, in order, read from its source.

    Raises:
        ConfigError: the class is missing, or a field has a type no option maps to.
    """
    tree = _module_tree(module)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        raise ConfigError(f"{module} defines no class {name}")
    out = []
    for i, node in enumerate(cls.body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        after = cls.body[i + 1] if i + 1 < len(cls.body) else None
        doc = (
            after.value.value
            if isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
            else ""
        )
        kind, optional, choices = _kind(module, node.annotation)
        out.append(
            ConfigField(
                name=node.target.id,
                kind=kind,
                default=_default(node.value),
                help=_clean(doc),
                optional=optional,
                choices=choices,
            )
        )
    return tuple(out)


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
