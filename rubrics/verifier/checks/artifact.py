"""Checks on the artifacts of the frozen workspace: presence, JSON, CSV, plans, receipts.

Each is registered under its function's name (see :mod:`bat_gym.rubrics.contract.checks`).
Files are read from the snapshot captured after the episode; what they are compared
with (expected case ids, the submission's columns, input columns) from the task's own
files in the start snapshot, which the agent cannot edit.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field

from bat_gym.rubrics.contract.checks import register_check
from bat_gym.rubrics.contract.context import CheckContext, CheckFailed, CheckResult, CheckUnscorable
from bat_gym.rubrics.verifier.reading import (
    CellType,
    ColumnRef,
    IdSource,
    JsonList,
    expected_ids,
    listing,
    parse_cell,
    read_csv,
    read_json,
    read_text,
    start_list,
)

__all__ = [
    "file_exists",
    "file_nonempty",
    "json_valid",
    "csv_schema",
    "markdown_sections",
    "receipt_valid",
    "non_degenerate",
]


@register_check("file_exists")
def file_exists(ctx: CheckContext, *, path: str) -> CheckResult:
    """``path`` is a regular file of the final workspace."""
    if not ctx.workspace.exists(path):
        raise CheckFailed(
            f"{path} is {'a symlink, not a file' if ctx.workspace.is_link(path) else 'missing'}"
        )
    return CheckResult.ok(f"{path} exists ({ctx.workspace.size(path)} bytes)", ctx.artifact(path))


@register_check("file_nonempty")
def file_nonempty(ctx: CheckContext, *, path: str) -> CheckResult:
    """``path`` exists and holds more than whitespace."""
    if not read_text(ctx.workspace, path).strip():
        raise CheckFailed(f"{path} is empty or only whitespace", ctx.artifact(path))
    return CheckResult.ok(f"{path} has content", ctx.artifact(path))


JsonType = Literal["string", "integer", "number", "boolean", "object", "array", "null", "any"]
_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
    "any": lambda v: True,
}


@register_check("json_valid")
def json_valid(
    ctx: CheckContext, *, path: str, keys: dict[str, JsonType] | None = None
) -> CheckResult:
    """``path`` parses as JSON; with ``keys``, it is an object holding each key with its type."""
    data = read_json(ctx.workspace, path)
    if keys:
        if not isinstance(data, dict):
            raise CheckFailed(f"{path} is JSON but not an object", ctx.artifact(path))
        bad = [
            f"{k} ({'missing' if k not in data else f'not {t}'})"
            for k, t in keys.items()
            if k not in data or not _JSON_TYPES[t](data[k])
        ]
        if bad:
            raise CheckFailed(f"{path}: {listing(bad)}", ctx.artifact(path))
    return CheckResult.ok(
        f"{path} is valid JSON" + (f" with keys {sorted(keys)}" if keys else ""), ctx.artifact(path)
    )


@register_check("csv_schema")
def csv_schema(
    ctx: CheckContext,
    *,
    path: str,
    columns: Annotated[list[str], Field(min_length=1)] | JsonList,
    exact_columns: bool = True,
    types: dict[str, CellType] | None = None,
    allowed: dict[str, list[str | int | float]] | None = None,
    case_ids: IdSource | None = None,
    id_column: str = "id",
    coverage: Literal["all", "subset"] = "all",
    min_rows: Annotated[int, Field(ge=0)] = 1,
) -> CheckResult:
    """A CSV with the given columns, typed cells, allowed values and case ids.

    Args:
        ctx: what the check may read.
        path: the CSV file.
        columns: required columns; with ``exact_columns`` the header is exactly these, in
            order. Either a list, or where the task lists them in the start workspace
            (``{file: task.json, key: submission.columns}``), so one contract fits every
            benchmark whose task states its schema.
        exact_columns: whether other columns or another order fail.
        types: column to ``int``, ``float`` or ``str`` (non-empty); every cell must parse.
        allowed: column to the values it may take (compared after ``types``).
        case_ids: expected ids, read from the start workspace.
        id_column: the column holding case ids.
        coverage: ``all``: one row per expected id, no others; ``subset``: rows name
            distinct expected ids.
        min_rows: fewest data rows accepted.
    """
    if isinstance(columns, JsonList):
        columns = start_list(ctx, columns, "columns")
        if not columns:
            raise CheckUnscorable("the task lists no columns")
    header, rows = read_csv(ctx.workspace, path)
    evidence = ctx.artifact(path)
    if exact_columns and header != columns:
        raise CheckFailed(f"{path} header is {header}, expected exactly {columns}", evidence)
    missing = [c for c in columns if c not in header]
    if missing:
        raise CheckFailed(f"{path} lacks columns {missing} (header {header})", evidence)
    if len(rows) < min_rows:
        raise CheckFailed(f"{path} has {len(rows)} data rows, fewer than {min_rows}", evidence)
    types, allowed = types or {}, allowed or {}
    for column in [*types, *allowed]:
        if column not in header:
            raise CheckFailed(f"{path} has no column {column!r} to check", evidence)
    bad: list[str] = []
    for n, row in enumerate(rows, start=2):
        for column, kind in types.items():
            try:
                parse_cell(row[column], kind)
            except ValueError:
                bad.append(f"line {n} {column}={row[column]!r} is not {kind}")
        for column, values in allowed.items():
            kind = types.get(column)
            try:
                ok = parse_cell(row[column], kind) in {parse_cell(str(v), kind) for v in values}
            except ValueError:
                ok = False
            if not ok:
                bad.append(f"line {n} {column}={row[column]!r} is not one of {values}")
    if bad:
        raise CheckFailed(f"{path}: {listing(bad)}", evidence)
    if case_ids is not None:
        if id_column not in header:
            raise CheckFailed(f"{path} has no id column {id_column!r}", evidence)
        expected = expected_ids(ctx, case_ids)
        got = Counter(row[id_column] for row in rows)
        wanted = set(expected)
        dupes = sorted(i for i, n in got.items() if n > 1)
        extra = [i for i in got if i not in wanted]
        absent = [i for i in expected if i not in got] if coverage == "all" else []
        problems = [
            f"{label}: {listing(ids)}"
            for label, ids in (
                ("duplicated ids", dupes),
                ("unexpected ids", extra),
                ("missing ids", absent),
            )
            if ids
        ]
        if problems:
            raise CheckFailed(f"{path}: {'; '.join(problems)}", evidence)
    detail = f"{path}: {len(rows)} rows, columns {header}"
    return CheckResult.ok(
        detail + (" cover every expected id" if case_ids and coverage == "all" else ""), evidence
    )


_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")


@register_check("markdown_sections")
def markdown_sections(
    ctx: CheckContext,
    *,
    path: str,
    sections: Annotated[list[str], Field(min_length=1)],
    min_chars: Annotated[int, Field(ge=0)] = 1,
) -> CheckResult:
    """``path`` has a heading for each section, each with at least ``min_chars`` of body.

    A heading matches a section when its text starts with the section name, ignoring
    case (``## Preprocessing`` matches ``Preprocess``). Lines in code fences are body.
    """
    bodies: list[tuple[str, list[str]]] = []
    fenced = False
    for line in read_text(ctx.workspace, path).splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else _HEADING.match(line)
        if heading:
            bodies.append((heading.group(2).strip().lower(), []))
        elif bodies:
            bodies[-1][1].append(line)
    evidence = ctx.artifact(path)
    problems = []
    for name in sections:
        found = [b for h, b in bodies if h.startswith(name.lower())]
        if not found:
            problems.append(f"no '{name}' heading")
        elif max(len("".join(b).strip()) for b in found) < min_chars:
            problems.append(f"'{name}' section is empty")
    if problems:
        raise CheckFailed(f"{path}: {'; '.join(problems)}", evidence)
    return CheckResult.ok(f"{path} has sections {sections}", evidence)


_SHA = re.compile(r"^[0-9a-fA-F]{64}$")


def _workspace_path(raw: str) -> str | None:
    """A receipt's artifact path as a workspace path (``/workspace/`` and ``./`` dropped)."""
    path = posixpath.normpath(raw.removeprefix("/workspace/"))
    return None if path.startswith(("/", "..")) or path == "." else path


@register_check("receipt_valid")
def receipt_valid(
    ctx: CheckContext,
    *,
    path: str,
    artifact: str | None = None,
    stage: str | None = None,
    schema_version: int | None = None,
) -> CheckResult:
    """A receipt JSON whose recorded sha256 is the artifact's real sha256.

    The receipt holds ``schema_version``, ``stage``, ``artifact`` and ``sha256``. It
    passes when ``artifact`` (if given) and ``stage`` (if given) match, and the sha256
    equals the sha256 of the artifact file in the frozen workspace.
    """
    receipt = read_json(ctx.workspace, path)
    evidence = ctx.artifact(path)
    if not isinstance(receipt, dict):
        raise CheckFailed(f"{path} is not a JSON object", evidence)
    missing = [k for k in ("schema_version", "stage", "artifact", "sha256") if k not in receipt]
    if missing:
        raise CheckFailed(f"{path} lacks {missing}", evidence)
    if schema_version is not None and receipt["schema_version"] != schema_version:
        raise CheckFailed(
            f"{path} schema_version is {receipt['schema_version']!r}, expected {schema_version}",
            evidence,
        )
    if stage is not None and receipt["stage"] != stage:
        raise CheckFailed(f"{path} is for stage {receipt['stage']!r}, expected {stage!r}", evidence)
    named = _workspace_path(receipt["artifact"]) if isinstance(receipt["artifact"], str) else None
    if named is None or (artifact is not None and named != artifact):
        raise CheckFailed(
            f"{path} names artifact {receipt['artifact']!r}, expected {artifact or 'a workspace file'!r}",
            evidence,
        )
    recorded = receipt["sha256"]
    if not isinstance(recorded, str) or not _SHA.match(recorded):
        raise CheckFailed(f"{path} sha256 is not 64 hex digits", evidence)
    real = ctx.workspace.sha256(named)
    if real is None:
        raise CheckFailed(f"{path} vouches for {named}, which is not in the workspace", evidence)
    evidence += ctx.artifact(named)
    if recorded.lower() != real:
        raise CheckFailed(
            f"{path} records sha256 {recorded[:12]}…, but {named} hashes to {real[:12]}…", evidence
        )
    return CheckResult.ok(f"{path} matches {named} (sha256 {real[:12]}…)", evidence)


@register_check("non_degenerate")
def non_degenerate(
    ctx: CheckContext,
    *,
    path: str,
    column: str,
    inputs: list[ColumnRef] | None = None,
    key: str = "id",
    min_rows: Annotated[int, Field(ge=2)] = 2,
) -> CheckResult:
    """A column that is not constant and not a copy of an input column.

    With at least ``min_rows`` rows, the column takes two or more values, and for
    each input column (read from the start workspace) it differs somewhere: row by row
    on the shared ``key`` when both files have it, else position by position.
    """
    header, rows = read_csv(ctx.workspace, path)
    evidence = ctx.artifact(path)
    if column not in header:
        raise CheckFailed(f"{path} has no column {column!r}", evidence)
    if len(rows) < min_rows:
        raise CheckFailed(f"{path} has {len(rows)} rows, fewer than {min_rows}", evidence)
    values = [r[column] for r in rows]
    if len(set(values)) < 2:
        raise CheckFailed(f"{path} column {column!r} is constant", evidence)
    for ref in inputs or []:
        try:
            in_header, in_rows = read_csv(ctx.start, ref.file)
        except CheckFailed as exc:
            raise CheckUnscorable(
                f"input {ref.file} unreadable in the start workspace: {exc.detail}"
            ) from None
        if ref.column not in in_header:
            raise CheckUnscorable(f"input {ref.file} has no column {ref.column!r}")
        if key in header and key in in_header:
            source = {r[key]: r[ref.column] for r in in_rows}
            pairs = [(r[column], source[r[key]]) for r in rows if r[key] in source]
        else:
            pairs = list(zip(values, (r[ref.column] for r in in_rows), strict=False))
        if len(pairs) >= min_rows and all(a == b for a, b in pairs):
            raise CheckFailed(f"{path} column {column!r} copies {ref.file}:{ref.column}", evidence)
    return CheckResult.ok(f"{path} column {column!r} takes {len(set(values))} values", evidence)
