"""skill_ladder's task generator and task metric.

A task is a handful of cases (4 to 6) and one flag the policy must get right, drawn
deterministically from ``(track, seed)``:

* ``units``: sizes recorded in mm or cm, as the card states; the model's threshold is
  in cm. Read in the wrong unit, every size leaves the model's range (the pilot's check
  fails) and every label becomes the same (all 1 from mm read as cm, all 0 from cm read
  as mm).
* ``cases``: sizes scaled by a per-task scanner drift; the card names the calibration
  phantom (0.2 cm) among the data rows. Calibrating on any submission case instead
  shrinks every size below the threshold, so every label becomes 0; skipping
  calibration (no pilot) carries one whole class across the threshold.
* ``codes``: codes written upper-case or in a legacy scheme; only the matching
  ``--codes`` fix, which the tool's check names, maps them into the model's table. Any
  other reading leaves them unknown, and unknown codes are labelled 0.

Labels are drawn first and values fitted to them, so the guarantees hold by
construction: each class holds between a third and two thirds of the cases (a wrong
flag scores at most 2/3), and the default pilot case (the first case) is one the
wrong flag of its track gets wrong. Sizes keep 0.3 cm from the threshold, so rounding
never decides a label.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from math import ceil
from typing import TYPE_CHECKING, Any

import numpy as np

from bat_gym.envs.skill_ladder.spec import TRACKS

if TYPE_CHECKING:
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["Draw", "draw", "reduce_draw", "public_files", "label_accuracy", "PHANTOM_CM"]

PHANTOM_CM = 0.2
RANGE_CM = (1.0, 8.0)
MARGIN_CM = 0.3  # sizes keep this far from the threshold, so rounding never flips a label
CODE_NAMES = ("alpha", "beta", "gamma", "delta", "omega")
_INT = re.compile(r"[+-]?[0-9]+")

CARDS = {
    "units": "The sizes are in {choice}.",
    "cases": "The scanner scale drifts; calibrate on phantom {choice}.",
    "codes": "Some codes are in another scheme; the check names the fix.",
}
_GOAL = {
    "units": "Label each case in data/cases.csv: 1 if its size reaches the model threshold, else 0.",
    "cases": "Label each case in data/cases.csv: 1 if its size reaches the model threshold, else 0.",
    "codes": "Label each case in data/cases.csv by its code in the model table.",
}


@dataclass(frozen=True)
class Draw:
    """One generated task: public data and model, the right flag, and the truth.

    Attributes:
        track: the track.
        case_ids: the submission's case ids, in order.
        rows: ``data/cases.csv`` rows in file order (the phantom among them in ``cases``).
        model: ``model/model.json``.
        meta: extra ``task.json`` keys (the calibration of ``cases``).
        choice: the right flag value: the unit, the phantom id, or the code fix.
        labels: the true label of every submission case (private).
        examples: labels of non-submission cases a pilot may name (the phantom).
    """

    track: str
    case_ids: tuple[str, ...]
    rows: tuple[dict[str, str], ...]
    model: dict[str, Any]
    choice: str
    labels: dict[str, int]
    meta: dict[str, Any] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)

    @property
    def card(self) -> str:
        """The task card: the goal and the one fact the flag depends on."""
        return f"{_GOAL[self.track]} {CARDS[self.track].format(choice=self.choice)}"

    @property
    def pilot_case(self) -> str:
        """The case a correct pilot names: the phantom in ``cases``, else the first case."""
        return self.choice if self.track == "cases" else self.case_ids[0]


def _labels(rng: np.random.Generator, n: int, first: int | None) -> list[int]:
    """Balanced labels (each class a third to two thirds), the first one fixed if asked."""
    least = ceil(n / 3)
    positives = int(rng.integers(least, n - least + 1))
    labels = [1] * positives + [0] * (n - positives)
    rng.shuffle(labels)
    if first is not None and labels[0] != first:
        k = labels.index(first)  # both classes are present, so this exists
        labels[0], labels[k] = labels[k], labels[0]
    return labels


def _sizes(rng: np.random.Generator, labels: list[int], threshold: float) -> list[float]:
    """True sizes in cm inside the model range, at least MARGIN_CM from the threshold."""
    low, high = RANGE_CM[0] + MARGIN_CM, RANGE_CM[1] - MARGIN_CM
    return [
        round(
            float(
                rng.uniform(threshold + MARGIN_CM, high)
                if y
                else rng.uniform(low, threshold - MARGIN_CM)
            ),
            2,
        )
        for y in labels
    ]


def draw(track: str, seed: int) -> Draw:
    """The task of ``(track, seed)``; the same arguments give the same task.

    Raises:
        ValueError: an unknown track.
    """
    if track not in TRACKS:
        raise ValueError(f"unknown track {track!r}; tracks are {list(TRACKS)}")
    rng = np.random.default_rng([seed, TRACKS.index(track)])
    n = int(rng.integers(4, 7))
    numbers = rng.choice(np.arange(1, 100), size=n + 1, replace=False)
    ids = [f"c{int(k):02d}" for k in numbers]
    case_ids, spare = ids[:n], ids[n]
    if track == "codes":
        return _codes(rng, case_ids)
    threshold = round(float(rng.uniform(2.5, 5.5)), 1)
    model = {"kind": "threshold", "threshold_cm": threshold, "range_cm": list(RANGE_CM)}
    if track == "units":
        unit = str(rng.choice(["mm", "cm"]))
        # The default pilot case must flip under the other unit: mm read as cm makes
        # every label 1, cm read as mm every label 0.
        labels = _labels(rng, n, first=0 if unit == "mm" else 1)
        sizes = _sizes(rng, labels, threshold)
        values = [f"{s * 10:.1f}" if unit == "mm" else f"{s:.2f}" for s in sizes]
        rows = tuple({"id": i, "value": v} for i, v in zip(case_ids, values, strict=True))
        return Draw(
            track, tuple(case_ids), rows, model, unit, dict(zip(case_ids, labels, strict=True))
        )
    labels = _labels(rng, n, first=None)
    sizes = _sizes(rng, labels, threshold)
    # The drift carries every size of one class 10% past the threshold, so labelling
    # without calibration is as wrong as a wrong flag: one label for every case.
    if rng.random() < 0.5:
        scale = 1.1 * threshold / min(s for s, y in zip(sizes, labels, strict=True) if not y)
    else:
        scale = 0.9 * threshold / max(s for s, y in zip(sizes, labels, strict=True) if y)
    scale = round(scale, 3)
    rows_list = [
        {"id": i, "value": f"{s * scale:.4f}"} for i, s in zip(case_ids, sizes, strict=True)
    ]
    # Never first: the pilot's default case is the first row, and must be the wrong one.
    rows_list.insert(
        int(rng.integers(1, n + 1)), {"id": spare, "value": f"{PHANTOM_CM * scale:.4f}"}
    )
    return Draw(
        track,
        tuple(case_ids),
        tuple(rows_list),
        model,
        spare,
        dict(zip(case_ids, labels, strict=True)),
        meta={"calibration": {"phantom_cm": PHANTOM_CM}},
        examples={spare: int(threshold <= PHANTOM_CM)},
    )


def _codes(rng: np.random.Generator, case_ids: list[str]) -> Draw:
    """A ``codes`` task: a code table with both labels, and codes in a foreign scheme."""
    table_labels = [0, 0, 1, 1, int(rng.integers(0, 2))]
    rng.shuffle(table_labels)
    table = dict(zip(CODE_NAMES, (int(y) for y in table_labels), strict=True))
    legacy_names = [f"K{k}" for k in rng.permutation(len(CODE_NAMES)) + 1]
    legacy = dict(zip(legacy_names, CODE_NAMES, strict=True))
    fix = str(rng.choice(["lower", "legacy"]))
    # The default pilot case is labelled 1: read without the right fix it is unknown,
    # and unknown codes are labelled 0.
    labels = _labels(rng, len(case_ids), first=1)
    written = {name: (name.upper() if fix == "lower" else k) for k, name in legacy.items()}
    rows = []
    for case, y in zip(case_ids, labels, strict=True):
        name = str(rng.choice([c for c in CODE_NAMES if table[c] == y]))
        rows.append({"id": case, "code": written[name]})
    model = {"kind": "lookup", "table": table, "legacy": dict(sorted(legacy.items()))}
    return Draw(
        "codes", tuple(case_ids), tuple(rows), model, fix, dict(zip(case_ids, labels, strict=True))
    )


def reduce_draw(d: Draw, max_cases: int) -> Draw:
    """``d`` with only its first ``max_cases`` submission cases (the phantom stays)."""
    keep = d.case_ids[:max_cases]
    extra = set(d.examples)
    rows = tuple(r for r in d.rows if r["id"] in keep or r["id"] in extra)
    return Draw(
        d.track,
        keep,
        rows,
        d.model,
        d.choice,
        {c: d.labels[c] for c in keep},
        meta=d.meta,
        examples=d.examples,
    )


def _csv(rows: tuple[dict[str, str], ...]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def public_files(d: Draw, tool_source: str) -> dict[str, str]:
    """Every file the agent starts with, by workspace path."""
    meta = {
        "benchmark": "skill_ladder",
        "track": d.track,
        "model": "model/model.json",
        "data": "data/cases.csv",
        **d.meta,
        "submission": {
            "file": "outputs/submission.csv",
            "columns": ["id", "label"],
            "case_ids": list(d.case_ids),
        },
    }
    return {
        "TASK.md": f"# skill_ladder: {d.track}\n\n{d.card}\n\nTool: python tool/pipe.py --help\n",
        "task.json": json.dumps(meta, indent=2) + "\n",
        "data/cases.csv": _csv(d.rows),
        "model/model.json": json.dumps(d.model, indent=2) + "\n",
        "tool/pipe.py": tool_source,
    }


def label_accuracy(
    workspace: FrozenWorkspace,
    path: str,
    truth: dict[str, int],
    *,
    scored: list[str] | None,
    columns: list[str] | None = None,
) -> float:
    """Accuracy of the ``id,label`` CSV at ``path``.

    ``accuracy = (1 / |R|) * sum_{r in R} [label_r == truth_r]`` over the scored ids
    ``R``: ``scored`` when given (every one must have a row, else 0), else the file's
    own rows (each must be a key of ``truth``, else 0). 0 when the file is missing or
    garbled: not UTF-8 CSV, no ``id`` and ``label`` columns (exactly ``columns`` when
    given), an id given twice, no rows. A label that is not an integer is wrong.
    """
    try:
        reader = csv.DictReader(io.StringIO(workspace.read_text(path)))
        header = [h.strip() for h in reader.fieldnames or ()]
        rows = list(reader)
    except (OSError, ValueError, csv.Error):
        return 0.0
    if (columns is not None and header != columns) or not {"id", "label"} <= set(header):
        return 0.0
    predicted: dict[str, str] = {}
    for row in rows:
        case = (row.get("id") or "").strip()
        if case in predicted:
            return 0.0
        predicted[case] = (row.get("label") or "").strip()
    ids = list(predicted) if scored is None else scored
    if not ids or not set(ids) <= set(truth) or not set(ids) <= set(predicted):
        return 0.0
    right = sum(
        _INT.fullmatch(predicted[c]) is not None and int(predicted[c]) == truth[c] for c in ids
    )
    return right / len(ids)
