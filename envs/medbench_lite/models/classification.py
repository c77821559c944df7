"""Focal lung opacity classifier for frontal chest radiographs: ROI statistics + logistic.

MedBench-Lite model ``opacity-linear``; numpy only. See MODEL_CARD.md for the input
convention: modality values (after rescale) in MONOCHROME2 sense, 0..4095.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "lung_roi", "features", "classify"]


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


def features(values: np.ndarray, weights: dict) -> np.ndarray:
    """Lung-field features in full-scale units: focal spread and mean density.

    The spread (98th percentile over the median) picks up a focal opacity; the mean
    picks up the diffuse density an opacity adds. Both assume dark lungs.
    """
    x = np.asarray(values, dtype=np.float64) / float(weights["full_scale"])
    lung = x[lung_roi(x.shape, weights)]
    return np.array([np.percentile(lung, 98) - np.median(lung), lung.mean()])


def classify(values: np.ndarray, weights: dict) -> tuple[int, float]:
    """Return ``(label, p_opacity)`` for one image of modality values (MONOCHROME2)."""
    z = float(weights["bias"] + np.dot(weights["coef"], features(values, weights)))
    p = 1.0 / (1.0 + np.exp(-z))
    return int(p >= 0.5), p
