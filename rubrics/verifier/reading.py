"""Reading what the agent wrote, for checks: text, JSON and CSV that fail with a reason.

Every reader takes a :class:`~bat_gym.rubrics.contract.workspace.FrozenWorkspace` and raises
:class:`~bat_gym.rubrics.contract.context.CheckFailed` naming the file and the problem when the
content is missing, too large, not UTF-8 or malformed, so a check never crashes on a
garbled artifact. Ground truth (expected case ids, the submission's columns) is read
from the task's own files in the *start* workspace, never from the agent's copy, and
its absence is the state's fault, not the agent's (:class:`CheckUnscorable`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.rubrics.contract.context import CheckContext, CheckFailed, CheckUnscorable
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = [
    "JsonList",
    "IdSource",
    "ColumnRef",
    "CellType",
    "read_text",
    "read_json",
    "read_csv",
    "expected_ids",
    "start_list",
    "listing",
    "parse_cell",
    "states_answer",
]

_ARG = ConfigDict(extra="forbid", frozen=True)


class JsonList(BaseModel):
    """A list of strings in a JSON file of the *start* workspace (case ids, column names).

    In a contract: ``{file: task.json, key: submission.columns}``.
    """

    model_config = _ARG

    file: str = Field(description="JSON file in the start workspace, e.g. task.json.")
    key: str = Field(description="Dotted key of a list of strings, e.g. submission.case_ids.")


IdSource = JsonList
"""Where expected case ids come from (a :class:`JsonList`)."""


class ColumnRef(BaseModel):
    """A column of a CSV file of the *start* workspace."""

    model_config = _ARG

    file: str = Field(description="CSV file in the start workspace, e.g. data/cases.csv.")
    column: str = Field(description="Column name.")


def read_text(ws: FrozenWorkspace, path: str) -> str:
    """The file as UTF-8 text; fails if it is missing, a symlink, too large or not UTF-8."""
    try:
        return ws.read_text(path)
    except FileNotFoundError as exc:
        raise CheckFailed(str(exc)) from None
    except UnicodeDecodeError:
        raise CheckFailed(f"{path} is not UTF-8 text") from None
    except ValueError as exc:
        raise CheckFailed(str(exc)) from None


def read_json(ws: FrozenWorkspace, path: str) -> Any:
    """The file parsed as JSON; fails as :func:`read_text` does, or on invalid JSON."""
    try:
        return json.loads(read_text(ws, path))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CheckFailed(
            f"{path} is not valid JSON: {getattr(exc, 'msg', 'nested too deeply')}"
        ) from None


def read_csv(ws: FrozenWorkspace, path: str) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows (cells stripped, blank lines skipped).

    Fails as :func:`read_text` does, and on a missing or repeated header column, a row
    whose field count differs from the header's, or a CSV syntax error.
    """
    text = read_text(ws, path)
    try:
        lines = [r for r in csv.reader(io.StringIO(text)) if r]
    except csv.Error as exc:
        raise CheckFailed(f"{path} is not valid CSV: {exc}") from None
    if not lines:
        raise CheckFailed(f"{path} is empty (no header)")
    header = [h.strip() for h in lines[0]]
    if len(set(header)) != len(header):
        raise CheckFailed(f"{path} repeats a column in its header {header}")
    rows = []
    for n, cells in enumerate(lines[1:], start=2):
        if len(cells) != len(header):
            raise CheckFailed(
                f"{path} line {n} has {len(cells)} fields; the header has {len(header)}"
            )
        rows.append(dict(zip(header, (c.strip() for c in cells), strict=True)))
    return header, rows


def _dig(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            raise KeyError(dotted)
        data = data[part]
    return data


def start_list(ctx: CheckContext, source: JsonList, what: str = "strings") -> list[str]:
    """The list ``source`` names, read from the start workspace.

    Raises:
        CheckUnscorable: the file or key is missing, or the value is not a list of
            strings; the state, not the agent, is then at fault.
    """
    try:
        values = _dig(json.loads(ctx.start.read_text(source.file)), source.key)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise CheckUnscorable(
            f"{what} {source.file}:{source.key} unreadable in the start workspace ({exc})"
        ) from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise CheckUnscorable(
            f"{source.file}:{source.key} in the start workspace is not a list of {what}"
        )
    return values


def expected_ids(ctx: CheckContext, source: IdSource) -> list[str]:
    """Case ids from the start workspace; their absence is the bank's fault, not the agent's."""
    return start_list(ctx, source, "expected ids")


def listing(items: list[str], limit: int = 5) -> str:
    """The first ``limit`` items, comma-separated, and how many more there are.

    >>> listing(["a", "b", "c"], limit=2)
    'a, b and 1 more'
    """
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


_INT = re.compile(r"[+-]?[0-9]+")
CellType = Literal["int", "float", "str"]


def parse_cell(value: str, kind: CellType | None) -> Any:
    """``value`` as ``kind``; raises ValueError if it is not one."""
    if kind == "int":
        if not _INT.fullmatch(value):
            raise ValueError(value)
        return int(value)
    if kind == "float":
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(value)
        return number
    if kind == "str" and not value:
        raise ValueError(value)
    return value


def states_answer(cell: str, answer: Any) -> bool:
    """Whether a CSV cell states ``answer`` (compared as the answer's type)."""
    try:
        if isinstance(answer, bool):
            return cell.lower() in (("1", "true") if answer else ("0", "false"))
        if isinstance(answer, int):
            return parse_cell(cell, "int") == answer
        if isinstance(answer, float):
            return math.isclose(parse_cell(cell, "float"), answer, rel_tol=1e-9, abs_tol=1e-12)
    except ValueError:
        return False
    return cell == str(answer)
