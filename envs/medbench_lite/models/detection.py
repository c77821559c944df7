"""Focal lesion detector for 2D images: blob proposals scored by a matched filter.

MedBench-Lite model ``lesion-matched``; numpy only. Bright compact blobs are proposed
by local contrast and connected components; each is scored by the strongest response
inside it of the matched filter ``weights["kernel"]``, which holds the texture of the
lesions this model was trained on (look-alikes of the same size and brightness score
low). Boxes come out in numpy index order, ``(row_min, col_min, row_max, col_max)``;
see MODEL_CARD.md.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "box_mean", "label_components", "response", "detect"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def box_mean(a: np.ndarray, size: int) -> np.ndarray:
    """Mean over a ``size`` x ``size`` window around each pixel (edges repeated)."""
    r = size // 2
    out = a.astype(np.float64)
    for axis in (0, 1):
        pad = [(0, 0), (0, 0)]
        pad[axis] = (r + 1, r)
        c = np.cumsum(np.pad(out, pad, mode="edge"), axis=axis)
        n = out.shape[axis]
        out = (
            np.take(c, np.arange(size, size + n), axis=axis) - np.take(c, np.arange(n), axis=axis)
        ) / size
    return out


def label_components(mask: np.ndarray) -> np.ndarray:
    """4-connected component labels (0 = background) by propagating the max label."""
    lab = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:
        prev = lab
        grown = lab.copy()
        grown[1:] = np.maximum(grown[1:], lab[:-1])
        grown[:-1] = np.maximum(grown[:-1], lab[1:])
        grown[:, 1:] = np.maximum(grown[:, 1:], lab[:, :-1])
        grown[:, :-1] = np.maximum(grown[:, :-1], lab[:, 1:])
        lab = np.where(mask, grown, 0)
        if np.array_equal(lab, prev):
            return lab


def response(x: np.ndarray, weights: dict) -> np.ndarray:
    """Matched-filter response per pixel of a [0, 1] image (local background removed)."""
    x = x - box_mean(x, int(weights["outer"]))
    k = np.asarray(weights["kernel"], dtype=np.float64)
    r = k.shape[0] // 2
    xp = np.pad(x, r, mode="reflect")
    spec = np.fft.rfft2(xp) * np.conj(np.fft.rfft2(k, s=xp.shape))
    return np.fft.irfft2(spec, s=xp.shape)[: x.shape[0], : x.shape[1]]


def detect(image: np.ndarray, weights: dict) -> list[dict]:
    """Find the lesions.

    Args:
        image: 2D grayscale image, float in [0, 1]. Integer-range input is scaled
            for convenience: by 1/255 when its maximum is at most 255, else 1/4095.
        weights: the dict returned by :func:`load`.

    Returns:
        One dict per lesion: ``box_rc`` = ``[row_min, col_min, row_max, col_max]``
        (pixel edges, half-open, **row/column order**) and ``score`` in (0, 1),
        highest first.
    """
    x = np.asarray(image, dtype=np.float64)
    if x.max() > 1.5:
        x = x / (255.0 if x.max() <= 255 else 4095.0)
    contrast = box_mean(x, int(weights["inner"])) - box_mean(x, int(weights["outer"]))
    lab = label_components(contrast > float(weights["threshold"]))
    resp = response(x, weights)
    out = []
    pad = float(weights["pad"])
    for k in np.unique(lab[lab > 0]):
        rows, cols = np.nonzero(lab == k)
        if not int(weights["min_area"]) <= rows.size <= int(weights["max_area"]):
            continue
        peak = float(resp[rows, cols].max())
        score = 1.0 / (1.0 + np.exp(-float(weights["gain"]) * (peak - float(weights["bias"]))))
        if score < float(weights["min_score"]):
            continue
        box = [rows.min() - pad, cols.min() - pad, rows.max() + 1 + pad, cols.max() + 1 + pad]
        out.append({"box_rc": [round(float(v), 2) for v in box], "score": round(score, 4)})
    return sorted(out, key=lambda d: -d["score"])
