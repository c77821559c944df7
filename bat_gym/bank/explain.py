"""Why a bank holds what it holds: each task's record and verdict, and the bank's gaps.

A build keeps one record per teacher trajectory (the journal ``rows.partial.jsonl`` of
a bank directory; ``trajectories/`` of the default states): its rows, or why it was
rejected, and the verifier's verdict in brief
(:func:`~bat_gym.bank.replay.verdict_summary`). :func:`explain` turns records into
lines a person reads; :func:`gaps` lists the (focus, track) cells a bank left empty;
:func:`admission_shares` and :func:`share_lines` say what share of the candidate rows
was admitted, per focus and outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bat_gym.benchmark import Benchmark
from bat_gym.core.errors import BankError

__all__ = ["admission_shares", "explain", "gaps", "journal_records", "share_lines"]


def journal_records(root: str | Path) -> dict[str, dict[str, Any]]:
    """The task records of the bank build journaled in ``root``, by task key.

    Raises:
        BankError: ``root`` holds no build journal.
    """
    path = Path(root) / "rows.partial.jsonl"
    try:
        lines = path.read_bytes().split(b"\n")[:-1]
    except FileNotFoundError:
        raise BankError(
            str(root), "no build journal (rows.partial.jsonl) here; build with `bat-gym bank build`"
        ) from None
    records: dict[str, dict[str, Any]] = {}
    for line in lines[1:]:  # the first line is the build's header
        try:
            record = json.loads(line)
        except ValueError:
            break  # a torn last line: the build was killed while writing it
        records[record["key"]] = record
    return records


def gaps(bench: Benchmark, rows: Iterable[Any], tracks: Sequence[str]) -> list[tuple[str, str]]:
    """The ``(focus, track)`` cells of ``tracks`` that no row covers, in spec order."""
    have = {(r.focus, r.track) for r in rows}
    return [(f, t) for t in tracks for f in bench.spec.focuses if (f, t) not in have]


def admission_shares(
    records: Iterable[dict[str, Any]],
) -> dict[str, dict[str, dict[str, int]]]:
    """Per focus and outcome, ``{"admitted": a, "rows": n}`` over the records' candidate rows.

    A candidate is a row cut from a kept trajectory; it is admitted when it passed the
    gates and a demonstration won it. The shape of the manifest's
    ``admission.shares``.
    """
    cells: dict[tuple[str, str], list[int]] = {}
    for record in records:
        for row in record.get("candidates", []):
            cell = cells.setdefault((row["focus"], row["outcome"]), [0, 0])
            cell[0] += row["refused"] is None
            cell[1] += 1
    table: dict[str, dict[str, dict[str, int]]] = {}
    for (focus, outcome), (admitted, rows) in sorted(cells.items()):
        table.setdefault(focus, {})[outcome] = {"admitted": admitted, "rows": rows}
    return table


def share_lines(shares: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[str]:
    """The admitted share as lines: a header, then one per focus with each outcome's share.

    >>> share_lines({"S4": {"failure": {"admitted": 1, "rows": 4}}})[1]
    'S4    failure 1/4 (25%)'
    """
    if not shares:
        return []
    total = sum(c["rows"] for o in shares.values() for c in o.values())
    admitted = sum(c["admitted"] for o in shares.values() for c in o.values())
    lines = [f"admitted {admitted} of {total} candidate rows (a demonstration wins each):"]
    for focus, outcomes in shares.items():
        cells = [
            f"{o} {c['admitted']}/{c['rows']} ({100 * c['admitted'] / max(c['rows'], 1):.0f}%)"
            for o, c in outcomes.items()
        ]
        lines.append(f"{focus:5} " + ", ".join(cells))
    return lines


def _score(x: float | None) -> str:
    return "null" if x is None else f"{x:.3f}"


def explain(
    records: Mapping[str, dict[str, Any]],
    *,
    tasks: Sequence[str] = (),
    all_tasks: bool = False,
) -> list[str]:
    """Lines explaining records: those rejected or with rows refused (every one with ``all_tasks``).

    Args:
        records: task records by key (:func:`journal_records`, or the default states').
        tasks: only the records whose key contains one of these strings (then kept
            ones are shown too).
        all_tasks: show kept records as well as rejected ones.
    """
    out: list[str] = []
    for key, record in records.items():
        if tasks and not any(t in key for t in tasks):
            continue
        rejected = record.get("rejected")
        findings = record.get("gate_findings") or []
        refused = any(c["refused"] for c in record.get("candidates", []))
        if not (rejected or findings or refused or all_tasks or tasks):
            continue
        if rejected:
            out.append(f"{key}: rejected: {rejected}")
        else:
            out.append(f"{key}: kept {len(record.get('rows', []))} state(s)")
        for state_id, gate, what in findings:
            out.append(f"  gate {gate} refused {state_id}: {what}")
        for row in record.get("candidates", []):
            refused = row["refused"]
            if refused is not None and not refused.startswith("gate "):
                out.append(
                    f"  not admitted {row['state_id']}: {refused} (reward "
                    f"{_score(row['reward'])} of an attainable {_score(row['attainable'])})"
                )
                out += [f"    {short}" for short in row.get("short", [])]
        verdict = record.get("verdict")
        if not verdict:
            if record.get("reward") is None and not rejected:
                out.append(
                    "  not scored (a scripted recovery or failure trajectory is kept as labelled)"
                )
            continue
        stages = ", ".join(f"{s} {_score(c)}" for s, c in verdict.get("stages", {}).items())
        out.append(
            f"  reward {_score(verdict.get('reward'))}, task score "
            f"{_score(verdict.get('task_score'))}, evidence completeness (eta) "
            f"{verdict['eta']:.2f}; stage credit {stages}"
        )
        for item in verdict.get("items", []):
            evidence = ", ".join(item.get("evidence", [])) or "none"
            out.append(
                f"  {item['stage']}.{item['item']} ({item['check']}) {item['status']}: "
                f"{item['detail']}  [evidence: {evidence}; requires {item.get('requires', [])}]"
            )
        for gate in verdict.get("gates", []):
            out.append(f"  gate {gate}")
        for note in verdict.get("notes", []):
            out.append(f"  note: {note}")
    return out
