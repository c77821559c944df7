"""How a radiology submission (or pilot) is compared with the model's measurements.

A row agrees with the model when both diameters are within :data:`AGREEMENT_MM` of the
model's (mm) and the change is the same word; the task metric and S3's pilot check are
the share of patients whose row agrees (:func:`agreement`).
"""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["AGREEMENT_MM", "COLUMNS", "agreement", "read_rows", "row_agrees"]

COLUMNS = ["id", "diameter_mm", "prior_mm", "change"]
AGREEMENT_MM = 0.05  # how far a diameter may be from the model's and still agree


def read_rows(workspace: FrozenWorkspace, path: str) -> dict[str, dict[str, str]] | None:
    """The CSV's rows by patient id; None for a missing or garbled file or a patient given twice."""
    try:
        reader = csv.DictReader(io.StringIO(workspace.read_text(path)))
        if not set(COLUMNS) <= set(reader.fieldnames or ()):
            return None
        rows = list(reader)
    except (OSError, ValueError, csv.Error):
        return None
    given: dict[str, dict[str, str]] = {}
    for row in rows:
        pid = (row["id"] or "").strip()
        if pid in given:
            return None
        given[pid] = row
    return given


def row_agrees(row: dict[str, str], want: dict[str, Any]) -> bool:
    """Both diameters within :data:`AGREEMENT_MM` of the model's (mm), and the change the same."""
    try:
        d, p = float(row["diameter_mm"]), float(row["prior_mm"])
    except (TypeError, ValueError):
        return False
    return (
        math.isfinite(d)
        and math.isfinite(p)
        and abs(d - want["diameter_mm"]) <= AGREEMENT_MM
        and abs(p - want["prior_mm"]) <= AGREEMENT_MM
        and (row["change"] or "").strip() == want["change"]
    )


def agreement(
    workspace: FrozenWorkspace, path: str, truth: dict[str, dict[str, Any]], *, complete: bool
) -> float:
    """Share of scored patients whose row agrees with the model's (:func:`row_agrees`).

    Scored: every patient when ``complete``, else the file's rows. 0 for a missing or
    garbled file, a patient given twice, or an unknown or (when complete) missing one.
    """
    given = read_rows(workspace, path)
    if given is None:
        return 0.0
    scored = list(truth) if complete else list(given)
    if not scored or not set(scored) <= set(truth) or not set(scored) <= set(given):
        return 0.0
    return sum(row_agrees(given[p], truth[p]) for p in scored) / len(scored)
