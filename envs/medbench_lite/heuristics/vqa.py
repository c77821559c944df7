"""Model-free shortcuts for the VQA track (see :mod:`..heuristics`).

- ``question_prior``: the a-priori likeliest answer of each question type, from the
  question text alone (no pixels).
- ``all_blobs``: every compact bright blob inside the lungs is a nodule (local
  contrast threshold plus connected components, kept where the surroundings are dark
  lung); side answers use each image's display convention.
- ``texture_cluster``: the blobs of all images are clustered into the six
  stripe-orientation sectors; the sector with the brightest mean blob is taken for the
  nodules.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._blobs import (
    angle_clusters,
    blobs,
    read_image,
    texture_angle,
)
from bat_gym.envs.medbench_lite.models.detection import box_mean

__all__ = ["HEURISTICS"]

_THRESHOLD = 0.15  # local contrast (image units in [0, 1]) of a blob
_LUNG = 0.55  # a blob's 21 px surroundings darker than this: it sits in a lung


def _questions(workspace: Path) -> list[dict]:
    path = Path(workspace) / "data" / "questions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _conventions(workspace: Path) -> dict[str, str]:
    with open(Path(workspace) / "data" / "metadata.csv", newline="") as f:
        return {r["image_id"]: r["view_convention"] for r in csv.DictReader(f)}


def _lung_blobs(x: np.ndarray) -> list[dict]:
    around = box_mean(x, 21)
    return [b for b in blobs(x, _THRESHOLD) if around[int(b["row"]), int(b["col"])] < _LUNG]


def _side(col: float, width: int, convention: str) -> str:
    image_left = col < width / 2
    if convention == "radiological":  # the patient's right on the image left
        return "right" if image_left else "left"
    return "left" if image_left else "right"


def _answer(question: str, nodules: list[dict], width: int, convention: str) -> str:
    q = question.lower()
    if "how many" in q and "left lung" in q:
        return str(sum(_side(b["col"], width, convention) == "left" for b in nodules))
    if "how many" in q:
        return str(len(nodules))
    if q.startswith("is there"):
        return "yes" if nodules else "no"
    if not nodules:
        return "none"
    return _side(max(nodules, key=lambda b: b["radius"])["col"], width, convention)


def _answer_all(workspace: Path, ids: Sequence[str], pick) -> dict[str, dict[str, str]]:
    """Rows from ``pick(image_id, x, blobs) -> nodules`` for every question in ``ids``."""
    conv = _conventions(workspace)
    rows = {}
    cache: dict[str, tuple[int, list[dict]]] = {}
    for q in _questions(workspace):
        if q["qid"] not in ids:
            continue
        if q["image_id"] not in cache:
            x = read_image(Path(workspace) / "data" / "images" / f"{q['image_id']}.png")
            cache[q["image_id"]] = (x.shape[1], pick(q["image_id"], x, _lung_blobs(x)))
        width, nodules = cache[q["image_id"]]
        rows[q["qid"]] = {"answer": _answer(q["question"], nodules, width, conv[q["image_id"]])}
    return rows


def question_prior(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """The likeliest answer per question type, without looking at any image."""
    prior = {"is there": "yes", "how many": "0"}  # P(no nodule in an image) is about 0.48
    rows = {}
    for q in _questions(workspace):
        text = q["question"].lower()
        ans = next((a for k, a in prior.items() if text.startswith(k)), "none")
        rows[q["qid"]] = {"answer": ans}
    return {k: v for k, v in rows.items() if k in set(ids)}


def all_blobs(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Every bright blob in the lungs counts as a nodule."""
    return _answer_all(workspace, set(ids), lambda _i, _x, bs: bs)


def texture_cluster(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Nodules = the blobs of the orientation sector with the brightest mean blob."""
    entries = []
    for path in sorted((Path(workspace) / "data").rglob("*.png")):
        x = read_image(path)
        for b in _lung_blobs(x):
            entries.append((path.stem, b, texture_angle(x, b["row"] - 0.5, b["col"] - 0.5)))
    keep: set[tuple[str, float, float]] = set()
    if entries:
        sector = angle_clusters(np.array([e[2] for e in entries]))
        contrast = np.array([e[1]["contrast"] for e in entries])
        means = [contrast[sector == s].mean() if (sector == s).any() else -1.0 for s in range(6)]
        pick = int(np.argmax(means))
        keep = {
            (e[0], e[1]["row"], e[1]["col"])
            for e, s in zip(entries, sector, strict=True)
            if s == pick
        }
    return _answer_all(
        workspace, set(ids), lambda i, _x, bs: [b for b in bs if (i, b["row"], b["col"]) in keep]
    )


HEURISTICS = {
    "question_prior": question_prior,
    "all_blobs": all_blobs,
    "texture_cluster": texture_cluster,
}
