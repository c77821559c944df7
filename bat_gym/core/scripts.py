"""Code that runs inside a sandbox, kept in real files: docstrings, slots and patches.

A benchmark keeps the code its scripted teacher or its verifier sends into a sandbox
as Python files in a package data folder, read as text and never imported, so that
ruff lints them and a test compiles them. Three ways to make the text sent from them:

* :func:`without_docstring`: a file's code less its module docstring, which is for
  readers here and is not sent (a fragment spliced into a larger script).
* :func:`fill_slots`: a script with slots, names ``SLOT_<KEY>``. Alone on its line a
  slot stands for code (a fragment); inside a line, for a value, written as its
  ``repr`` or, for a :class:`Source`, as the text given.
* :func:`replace_function`: a script with one top-level function replaced by the
  function of the same name in a patch file (a realistic mistake, say), every other
  line kept as it is.

Every function takes and returns text; none changes a byte it is not asked to.
"""

from __future__ import annotations

import ast
import re

from bat_gym.core.errors import PluginError
from bat_gym.core.pyparse import parse

__all__ = ["Source", "without_docstring", "fill_slots", "replace_function"]

_SLOT = re.compile(r"\bSLOT_([A-Z][A-Z0-9_]*)\b")


class Source(str):
    """Python source a value slot takes as it is written, instead of the value's ``repr``.

    For a value written another way on purpose, e.g. case ids as a JSON list.
    """

    __slots__ = ()


def without_docstring(source: str) -> str:
    """``source`` less its module docstring, stripped, with one final newline."""
    body = parse(source).body
    first = body[0] if body else None
    end = 0
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        end = first.end_lineno or 0
    return "".join(source.splitlines(keepends=True)[end:]).strip() + "\n"


def _value(value: object) -> str:
    return value if isinstance(value, Source) else repr(value)


def fill_slots(source: str, where: str, **slots: object) -> str:
    """``source`` with each slot ``SLOT_<KEY>`` replaced by ``slots["<key>"]``.

    A slot alone on its line (no indent) stands for code: the line becomes the text
    given, stripped, with one final newline. A slot inside a line stands for a value:
    it becomes ``repr(value)``, or the text of a :class:`Source`. Every other character
    is kept.

    Args:
        source: the script's text.
        where: the script's name, for the error message.
        **slots: code or value by slot key in lower case (``SLOT_OUT_DIR``: ``out_dir``).

    Raises:
        PluginError: a slot of the script is not given, or one given is not in it
            (a ValueError too).
    """
    used = {key.lower() for key in _SLOT.findall(source)}
    if used != set(slots):
        raise PluginError(
            f"{where} has the slots {sorted(used)} but was given {sorted(slots)}: "
            "give each of its slots, and only those"
        )
    lines = []
    for line in source.splitlines(keepends=True):
        alone = _SLOT.fullmatch(line.rstrip("\n"))
        if alone:
            lines.append(str(slots[alone.group(1).lower()]).strip() + "\n")
        else:
            lines.append(_SLOT.sub(lambda m: _value(slots[m.group(1).lower()]), line))
    return "".join(lines)


def replace_function(base: str, patch: str, where: str) -> str:
    """``base`` with its top-level function named like the one ``patch`` defines replaced.

    ``patch`` defines exactly one top-level function; its lines (decorators aside)
    replace those of ``base``'s function of the same name. The rest of ``patch`` (a
    docstring, imports naming what the function uses from ``base``) is for readers
    and ruff.

    Args:
        base: the script's text.
        patch: the patch file's text.
        where: the patch's name, for the error messages.

    Raises:
        PluginError: the patch defines no function or several, or one ``base`` lacks
            (a ValueError too).
    """
    patch_fns = [n for n in parse(patch).body if isinstance(n, ast.FunctionDef)]
    if len(patch_fns) != 1:
        raise PluginError(
            f"{where} must define exactly one function, found "
            f"{[f.name for f in patch_fns]}: a patch replaces one function of the pipeline"
        )
    new = patch_fns[0]
    old = next(
        (n for n in parse(base).body if isinstance(n, ast.FunctionDef) and n.name == new.name),
        None,
    )
    if old is None:
        raise PluginError(
            f"{where} defines {new.name}(), which the pipeline lacks: name the patch's "
            "function after the pipeline function it replaces"
        )
    base_lines = base.splitlines(keepends=True)
    new_lines = patch.splitlines(keepends=True)[new.lineno - 1 : new.end_lineno]
    return "".join(base_lines[: old.lineno - 1] + new_lines + base_lines[old.end_lineno :])
