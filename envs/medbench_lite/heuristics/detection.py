"""Model-free shortcuts for the detection track (see :mod:`..heuristics`).

- ``all_blobs``: every compact bright blob (local contrast threshold plus connected
  components) is a lesion, scored by its contrast.
- ``largest_blobs``: the same boxes scored by blob area (lesions as the big ones).
- ``texture_cluster``: blobs are clustered into the six stripe-orientation sectors by
  their spectrum; the sector with the brightest mean blob is taken for the lesions
  and only its blobs are submitted.
"""

from __future__ import annotations

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

__all__ = ["HEURISTICS"]

_THRESHOLD = 0.08  # local contrast (image units in [0, 1]) of a blob


def _found(workspace: Path, ids: Sequence[str]) -> dict[str, tuple[np.ndarray, list[dict]]]:
    out = {}
    for cid in ids:
        path = Path(workspace) / "data" / "images" / f"{cid}.png"
        if not path.exists():
            path = path.with_suffix(".dcm")
        x = read_image(path)
        out[cid] = (x, blobs(x, _THRESHOLD))
    return out


def _write(workspace: Path, boxes: dict[str, list[list[float]]]) -> dict[str, dict[str, str]]:
    """Write ``outputs/detections/<id>.json`` per case; ``boxes`` are ``[x0, y0, x1, y1, s]``."""
    out = Path(workspace) / "outputs" / "detections"
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for cid, bs in boxes.items():
        (out / f"{cid}.json").write_text(json.dumps({"id": cid, "boxes": bs}))
        rows[cid] = {"detections_file": f"outputs/detections/{cid}.json", "n_boxes": str(len(bs))}
    return rows


def _xy(b: dict, score: float) -> list[float]:
    r0, c0, r1, c1 = b["box_rc"]
    return [c0, r0, c1, r1, float(score)]


def all_blobs(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Every blob a lesion, scored by contrast."""
    found = _found(workspace, ids)
    return _write(
        workspace, {c: [_xy(b, b["contrast"]) for b in bs] for c, (_, bs) in found.items()}
    )


def largest_blobs(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Every blob a lesion, scored by its radius."""
    found = _found(workspace, ids)
    return _write(workspace, {c: [_xy(b, b["radius"]) for b in bs] for c, (_, bs) in found.items()})


def texture_cluster(workspace: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Only the blobs of the orientation sector with the brightest mean blob."""
    found = _found(workspace, ids)
    entries = [
        (cid, b, texture_angle(x, b["row"] - 0.5, b["col"] - 0.5))
        for cid, (x, bs) in found.items()
        for b in bs
    ]
    boxes: dict[str, list[list[float]]] = {cid: [] for cid in ids}
    if entries:
        sector = angle_clusters(np.array([e[2] for e in entries]))
        contrast = np.array([e[1]["contrast"] for e in entries])
        means = [contrast[sector == s].mean() if (sector == s).any() else -1.0 for s in range(6)]
        pick = int(np.argmax(means))
        for (cid, b, _), s in zip(entries, sector, strict=True):
            if s == pick:
                boxes[cid].append(_xy(b, b["contrast"]))
    return _write(workspace, boxes)


HEURISTICS = {
    "all_blobs": all_blobs,
    "largest_blobs": largest_blobs,
    "texture_cluster": texture_cluster,
}
