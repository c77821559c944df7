"""What every MedBench-Lite track provides, and the helpers they share.

A track turns ``(seed, split)`` into a :class:`Draw`: every public file as bytes, the
private answers, and the track's part of ``task.json``. It scores a set of rows (the
submission's, or a one-case pilot's) against those answers with one metric, and hands
the teacher its :class:`~bat_gym.envs.medbench_lite.teacher.Recipe`.
"""

from __future__ import annotations

import csv
import io
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from bat_gym.envs.medbench_lite.teacher import Recipe

__all__ = [
    "Split",
    "Rows",
    "Draw",
    "TrackBase",
    "read_submission",
    "read_rows",
    "resolve_output",
    "read_output_volume",
    "uniform",
    "case_ids",
    "STAGE_ARTIFACTS",
    "Difficulty",
    "difficulty",
    "tier_bounds",
]

Split = Literal["train", "heldout"]
Rows = Mapping[str, Mapping[str, str]]
"""CSV rows by case id: ``{case_id: {column: cell}}``, as :func:`read_rows` returns them."""
Difficulty = Literal["easy", "hard"]

STAGE_ARTIFACTS: dict[str, tuple[str, ...]] = {
    "S1": ("plan/plan.md",),
    "S2": (
        "setup/environment.json",
        "setup/compatibility.json",
        "model/checkpoint.json",
        "setup/model_load.json",
        "pipeline/infer.py",
    ),
    "S3": ("validation/pilot.csv", "validation/s3_validation.json"),
    "S4": ("outputs/predictions.csv", "validation/s4_completion.json"),
    "S5": ("outputs/submission.csv", "validation/s5_submission.json"),
}


@dataclass(frozen=True)
class Draw:
    """One generated task: public bytes, private answers, public description.

    Attributes:
        case_ids: the ids the submission must cover, in order.
        params: public generator parameters (recorded in ``Task.params``).
        files: public files by workspace-relative path (``data/...``), as bytes.
        weights: the model parameters written to ``model/weights.npz``.
        model_card: text of ``model/MODEL_CARD.md``.
        task_md: the track-specific body of ``TASK.md``.
        task_json: the track's entries of ``task.json`` (inputs, output, columns).
        answers: private: what the metric needs; never written to the workspace.
    """

    case_ids: tuple[str, ...]
    params: dict[str, Any]
    files: dict[str, bytes]
    weights: dict[str, np.ndarray]
    model_card: str
    task_md: str
    task_json: dict[str, Any]
    answers: dict[str, Any] = field(repr=False)


class TrackBase(ABC):
    """One MedBench-Lite track: generator, writer, answers, metric and teacher recipe.

    ``ranges`` holds the parameters whose train and held-out ranges are disjoint:
    ``{split: {name: (low, high)}}``; every draw records those parameters in
    ``params`` so tests can check that a held-out task never uses a training value.
    """

    name: ClassVar[str]
    metric: ClassVar[str]
    description: ClassVar[str]
    index: ClassVar[int]
    ranges: ClassVar[dict[str, dict[str, tuple[float, float]]]]

    def rng(self, seed: int, split: Split) -> np.random.Generator:
        """The generator of one task: a pure function of track, seed and split."""
        return np.random.default_rng([seed, self.index, 0 if split == "train" else 1])

    @abstractmethod
    def draw(self, seed: int, split: Split) -> Draw:
        """Generate the task's files and answers."""

    def score_cases(self, draw: Draw, workspace: Path, rows: Rows, ids: Sequence[str]) -> float:
        """The track metric over the cases ``ids``, each read from its row in ``rows``.

        Default: the mean of :meth:`score_case` over ``ids``. A track whose metric pools
        the cases (mAP, balanced accuracy, pooled Dice) overrides this method instead.

        Args:
            draw: the task.
            workspace: where the files the rows name are resolved.
            rows: CSV rows by case id; every id in ``ids`` has one.
            ids: cases whose truth is known (:meth:`known_ids`).
        """
        return float(np.mean([self.score_case(draw, workspace, rows[c], c) for c in ids]))

    def score_case(self, draw: Draw, workspace: Path, row: Mapping[str, str], cid: str) -> float:
        """One case's score in ``[0, 1]`` from its submitted ``row`` (0.0 when unusable)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define score_case (a per-case metric) or "
            "score_cases (a metric pooled over the cases)"
        )

    def reduce(self, draw: Draw, max_cases: int) -> Draw:
        """The same task cut down to its first ``max_cases`` cases (an E2E surrogate).

        Generic over the tracks: the kept cases are ``draw.case_ids[:max_cases]``, and
        every trace of the others is removed consistently. Files named after a dropped
        id (``<id>.<ext>``, ``<id>_<suffix>``) are left out; JSON objects keyed by
        case id, JSONL records and CSV rows that name a dropped id lose those entries;
        ``task.json`` lists and private answers lose the dropped ids. Worked examples
        (training pairs, dev questions) and the model are kept. Ids named by
        :meth:`reduce_extra_drops` (inputs only the dropped cases use) go too.

        Args:
            draw: the full task.
            max_cases: how many cases to keep (at least 1; more than there are keeps all).

        Returns:
            The reduced draw; ``params["cases"]`` is the new case count.

        Raises:
            ValueError: ``max_cases`` is below 1.
        """
        if max_cases < 1:
            raise ValueError(f"max_cases must be at least 1, got {max_cases}")
        keep = tuple(draw.case_ids[:max_cases])
        drop = (set(draw.case_ids) - set(keep)) | set(self.reduce_extra_drops(draw, keep))
        if not drop:
            return draw
        files = {}
        for rel, data in draw.files.items():
            name = rel.rsplit("/", 1)[-1]
            if any(name.startswith((f"{d}.", f"{d}_")) for d in drop):
                continue
            files[rel] = _filter_file(name, data, drop)
        params = dict(draw.params)
        if "cases" in params:
            params["cases"] = len(keep)
        return replace(
            draw,
            case_ids=keep,
            params=params,
            files=files,
            task_json=_without(draw.task_json, drop),
            answers=_without(draw.answers, drop),
        )

    def reduce_extra_drops(self, draw: Draw, keep: Sequence[str]) -> frozenset[str]:
        """Ids of inputs, other than case ids, that a reduction to ``keep`` drops.

        Default: none. A track whose cases share inputs (VQA questions on images)
        names the inputs only dropped cases use.
        """
        return frozenset()

    def known_ids(self, draw: Draw) -> frozenset[str]:
        """Ids whose truth the metric can use: the test cases, plus worked examples."""
        return frozenset(draw.case_ids)

    def score(self, draw: Draw, workspace: Path) -> float:
        """The task metric of ``outputs/submission.csv`` (0.0 if it is unusable)."""
        rows = read_submission(workspace, draw)
        if rows is None:
            return 0.0
        return self.score_cases(draw, workspace, rows, draw.case_ids)

    def pilot_score(self, draw: Draw, workspace: Path, pilot_csv: str) -> float:
        """The task metric on the cases of a pilot CSV only (S3's quality check).

        The pilot is read like the submission (``id`` first, the submission's columns
        present) and scored with the same metric over its own rows. It scores 0.0 when
        it is unusable, empty, or names a case whose truth is unknown: a pilot on
        something that is not a case validates nothing.
        """
        rows = read_rows(Path(workspace) / pilot_csv, draw.task_json["submission"]["columns"])
        if not rows or not set(rows) <= self.known_ids(draw):
            return 0.0
        return self.score_cases(draw, workspace, rows, list(rows))

    def pilot_reference_score(
        self, draw: Draw, reference: Path, workspace: Path, pilot_csv: str
    ) -> float | None:
        """The reference run's metric on the cases the agent's pilot CSV names.

        The agent's pilot (in ``workspace``) is read only for its case ids. The
        reference run's rows for them come from its ``outputs/submission.csv``, or,
        for a case it did not submit (a worked example), from its own pilot at
        ``pilot_csv``; they are scored in ``reference`` (where the files they name
        live) with :meth:`score_cases`, the metric :meth:`pilot_score` uses.

        Returns:
            The score in ``[0, 1]``, or None when the agent's pilot is unusable or
            names a case that is unknown or has no reference row (the caller then
            rests on the reference's whole-task score).
        """
        columns = draw.task_json["submission"]["columns"]
        mine = read_rows(Path(workspace) / pilot_csv, columns)
        if not mine or not set(mine) <= self.known_ids(draw):
            return None
        ref_rows: dict[str, dict[str, str]] = {}
        for rel in (pilot_csv, "outputs/submission.csv"):
            ref_rows.update(read_rows(Path(reference) / rel, columns) or {})
        if not set(mine) <= set(ref_rows):
            return None
        return self.score_cases(draw, reference, ref_rows, list(mine))

    @abstractmethod
    def recipe(self) -> Recipe:
        """The track's part of the scripted teacher."""

    def card(self) -> str:
        """The task text shown to the agent."""
        return (
            f"MedBench-Lite {self.name} task: {self.description} The inputs are in data/, a "
            "pretrained model is in model/ (read model/MODEL_CARD.md), and task.json names the "
            "output format and the case ids. Work through the five stages (plan, setup, validate, "
            "infer, submit), writing each stage's artifacts, and submit outputs/submission.csv. "
            "Read TASK.md first."
        )


def _without(value: Any, drop: set[str]) -> Any:
    """``value`` with dict keys and list items that are dropped ids removed, recursively."""
    if isinstance(value, dict):
        return {k: _without(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_without(v, drop) for v in value if not (isinstance(v, str) and v in drop)]
    if isinstance(value, tuple):
        return tuple(_without(v, drop) for v in value if not (isinstance(v, str) and v in drop))
    return value


def _names(value: Any, drop: set[str]) -> bool:
    """Whether a decoded JSON value holds a dropped id as a string anywhere."""
    if isinstance(value, str):
        return value in drop
    if isinstance(value, dict):
        return any(k in drop or _names(v, drop) for k, v in value.items())
    if isinstance(value, list):
        return any(_names(v, drop) for v in value)
    return False


def _filter_file(name: str, data: bytes, drop: set[str]) -> bytes:
    """A shared public file with the dropped ids' entries removed (bytes as written)."""
    if name.endswith(".jsonl"):
        lines = data.decode("utf-8").splitlines(keepends=True)
        return "".join(ln for ln in lines if not _names(json.loads(ln), drop)).encode()
    if name.endswith(".json"):
        obj = json.loads(data)
        if not _names(obj, drop):
            return data
        return (json.dumps(_without(obj, drop), indent=2, sort_keys=True) + "\n").encode()
    if name.endswith(".csv"):
        reader = csv.reader(io.StringIO(data.decode("utf-8")))
        rows = list(reader)
        kept = rows[:1] + [r for r in rows[1:] if not set(r) & drop]
        if len(kept) == len(rows):
            return data
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(kept)
        return buf.getvalue().encode()
    return data


def difficulty(seed: int) -> Difficulty:
    """The difficulty tier of the task drawn from ``seed``: odd seeds are ``hard``.

    A pure function of the seed, so every split holds both tiers in equal shares
    (the ten held-out repeats of a track are five easy and five hard tasks) and the
    tier is known before anything is drawn. Every track records it as
    ``params["difficulty"]``.
    """
    return "hard" if seed % 2 else "easy"


def uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    """A float drawn uniformly from ``[low, high)``, rounded for readable params."""
    return float(np.round(rng.uniform(*bounds), 4))


def case_ids(rng: np.random.Generator, prefix: str, n: int) -> tuple[str, ...]:
    """``n`` distinct opaque case ids such as ``ct_0412``, sorted."""
    nums = rng.choice(10_000, size=n, replace=False)
    return tuple(sorted(f"{prefix}_{int(k):04d}" for k in nums))


def read_rows(path: Path, columns: Sequence[str]) -> dict[str, dict[str, str]] | None:
    """A CSV's rows by id, or None when the file is unusable.

    Unusable: missing, not UTF-8 CSV, ``id`` not the first column, or one of
    ``columns`` absent. An id given twice keeps its last row; a missing cell is ``""``.
    """
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            # A short row reads as None and a long one files its extra cells under
            # None; both become plain strings, so a scorer never meets a non-string.
            rows = {
                r.get("id") or "": {k: v if isinstance(v, str) else "" for k, v in r.items() if k}
                for r in reader
            }
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not header or header[0] != "id" or not set(columns) <= set(header):
        return None
    return rows


def read_submission(workspace: Path, draw: Draw) -> dict[str, dict[str, str]] | None:
    """The submission rows by id, or None when the file is unusable.

    Unusable as for :func:`read_rows`, or any required case id missing (a missing case
    makes the task score 0).
    """
    path = Path(workspace) / "outputs" / "submission.csv"
    rows = read_rows(path, draw.task_json["submission"]["columns"])
    if rows is None or any(i not in rows for i in draw.case_ids):
        return None
    return rows


def resolve_output(workspace: Path, relpath: str) -> Path | None:
    """A submission-referenced file inside the workspace, or None if it escapes it."""
    base = Path(workspace).resolve()
    try:
        p = (base / relpath).resolve()
    except (OSError, RuntimeError):
        return None
    return p if p.is_relative_to(base) and p.is_file() else None


def read_output_volume(
    path: Path | None, shape: tuple[int, ...], affine: np.ndarray
) -> np.ndarray | None:
    """The voxels (scaled, float64) of an output NIfTI on the input's grid, else None.

    None when the file is missing, unreadable, or not on the grid (shape and affine to
    1e-3): a wrong case, never a crash of the scorer.
    """
    if path is None:
        return None
    import nibabel as nib

    try:
        img = nib.load(str(path))
        if img.shape != tuple(shape) or not np.allclose(img.affine, affine, atol=1e-3):
            return None
        return np.asarray(img.dataobj, dtype=np.float64)
    except Exception:  # any decoding error of agent output
        return None


def tier_bounds(bounds: tuple[float, float], tier: Difficulty) -> tuple[float, float]:
    """The half of a split's ``(low, high)`` range a tier draws from: easy low, hard high.

    Tiers split each range rather than stretch it, so a held-out task of either tier
    still never uses a training value.
    """
    low, high = bounds
    mid = (low + high) / 2
    return (low, mid) if tier == "easy" else (mid, high)
