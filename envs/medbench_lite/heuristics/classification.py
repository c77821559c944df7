"""Model-free shortcuts for the classification track (see :mod:`..heuristics`).

- ``bright_blob``: the strongest compact bright blob in the image (threshold on local
  contrast plus connected components); the brighter half of the task's images is
  called positive.
- ``blob_count``: images with more blobs than the task's median are positive.
- ``texture_cluster``: every blob's stripe orientation is measured and clustered into
  the task's six orientation sectors; the sector with the brightest mean blob is taken
  for the opacity, and an image is positive when it holds a blob of that sector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._blobs import (
    angle_clusters,
    blobs,
    read_image,
    texture_angle,
)

__all__ = ["HEURISTICS"]

_THRESHOLD = 0.06  # local contrast (full-scale units) of a blob


def _found(workspace: Path, ids: Sequence[str]) -> dict[str, tuple[np.ndarray, list[dict]]]:
    out = {}
    for cid in ids:
        x = read_image(Path(workspace) / "data" / "images" / f"{cid}.dcm")
        out[cid] = (x, blobs(x, _THRESHOLD))
    return out


def _rows(labels: Mapping[str, int]) -> dict[str, dict[str, str]]:
    return {cid: {"label": str(int(v)), "confidence": "0.6"} for cid, v in labels.items()}


def bright_blob(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Positive when the image's brightest blob is above the task's median."""
    found = _found(workspace, ids)
    peak = {cid: max((b["contrast"] for b in bs), default=0.0) for cid, (_, bs) in found.items()}
    cut = float(np.median(list(peak.values())))
    return _rows({cid: int(v > cut) for cid, v in peak.items()})


def blob_count(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Positive when the image has more blobs than the task's median image."""
    found = _found(workspace, ids)
    count = {cid: len(bs) for cid, (_, bs) in found.items()}
    cut = float(np.median(list(count.values())))
    return _rows({cid: int(v > cut) for cid, v in count.items()})


def texture_cluster(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Positive when the image holds a blob of the brightest orientation sector."""
    found = _found(workspace, ids)
    entries = [
        (cid, b["contrast"], texture_angle(x, b["row"] - 0.5, b["col"] - 0.5))
        for cid, (x, bs) in found.items()
        for b in bs
    ]
    if not entries:
        return _rows({cid: 0 for cid in ids})
    sector = angle_clusters(np.array([e[2] for e in entries]))
    contrast = np.array([e[1] for e in entries])
    means = [contrast[sector == s].mean() if (sector == s).any() else -1.0 for s in range(6)]
    pick = int(np.argmax(means))
    hit = {e[0] for e, s in zip(entries, sector, strict=True) if s == pick}
    return _rows({cid: int(cid in hit) for cid in ids})


HEURISTICS = {
    "bright_blob": bright_blob,
    "blob_count": blob_count,
    "texture_cluster": texture_cluster,
}
