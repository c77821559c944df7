"""Focal lung opacity classifier for frontal chest radiographs: a matched filter + logistic.

MedBench-Lite model ``opacity-matched``; numpy only. The opacity this model was trained
on has a characteristic internal texture, held in ``weights["kernel"]``; look-alikes
(vessels seen end-on, overlapping rib and vessel shadows) are as bright and as large
but textured otherwise. See MODEL_CARD.md for the input convention: modality values
(after rescale) in MONOCHROME2 sense, 0..4095.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "lung_roi", "background", "response", "features", "classify"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def lung_roi(shape: tuple[int, int], weights: dict) -> np.ndarray:
    """The model's lung template: two ellipses, in relative image coordinates."""
    rows, cols = shape
    r = (np.arange(rows) + 0.5) / rows
    c = (np.arange(cols) + 0.5) / cols
    rr, cc = np.meshgrid(r, c, indexing="ij")
    roi = np.zeros(shape, dtype=bool)
    for cr, ccol, ar, ac in weights["roi_ellipses"]:
        roi |= ((rr - cr) / ar) ** 2 + ((cc - ccol) / ac) ** 2 <= 1.0
    return roi


def background(x: np.ndarray, size: int) -> np.ndarray:
    """Mean over a ``size`` x ``size`` window around each pixel (edges repeated)."""
    r = size // 2
    out = x.astype(np.float64)
    for axis in (0, 1):
        pad = [(0, 0), (0, 0)]
        pad[axis] = (r + 1, r)
        c = np.cumsum(np.pad(out, pad, mode="edge"), axis=axis)
        n = out.shape[axis]
        out = (
            np.take(c, np.arange(size, size + n), axis=axis) - np.take(c, np.arange(n), axis=axis)
        ) / size
    return out


def response(values: np.ndarray, weights: dict) -> np.ndarray:
    """The matched-filter response per pixel (full-scale units), same shape as ``values``.

    The image is scaled by ``1 / full_scale``, its local background (a
    ``background_px`` box mean) removed, and correlated with ``kernel`` centred on
    each pixel (edges reflected).
    """
    x = np.asarray(values, dtype=np.float64) / float(weights["full_scale"])
    x = x - background(x, int(weights["background_px"]))
    k = np.asarray(weights["kernel"], dtype=np.float64)
    r = k.shape[0] // 2
    xp = np.pad(x, r, mode="reflect")
    spec = np.fft.rfft2(xp) * np.conj(np.fft.rfft2(k, s=xp.shape))
    return np.fft.irfft2(spec, s=xp.shape)[: x.shape[0], : x.shape[1]]


def features(values: np.ndarray, weights: dict) -> np.ndarray:
    """``[peak]``: the strongest matched-filter response inside the lung template."""
    resp = response(values, weights)
    return np.array([float(resp[lung_roi(resp.shape, weights)].max())])


def classify(values: np.ndarray, weights: dict) -> tuple[int, float]:
    """Return ``(label, p_opacity)`` for one image of modality values (MONOCHROME2)."""
    z = float(weights["gain"]) * (float(features(values, weights)[0]) - float(weights["bias"]))
    p = 1.0 / (1.0 + np.exp(-z))
    return int(p >= 0.5), p
