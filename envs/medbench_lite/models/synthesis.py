"""MR contrast translation (A -> B): foreground normalization plus a learned lookup table.

MedBench-Lite model ``mr-lut``; numpy only. The table was fitted on normalized
intensities; see MODEL_CARD.md for the input convention.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "normalize", "predict"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def normalize(a: np.ndarray, weights: dict) -> tuple[np.ndarray, float]:
    """Scanner units -> the model's units: divide by a high percentile of the foreground.

    Returns:
        ``(a / scale, scale)``. The foreground is every voxel above ``fg_fraction`` of
        the 99.5th percentile; ``scale`` is its ``norm_percentile``-th percentile.
    """
    a = np.asarray(a, dtype=np.float64)
    fg = a > float(weights["fg_fraction"]) * np.percentile(a, 99.5)
    scale = float(np.percentile(a[fg], float(weights["norm_percentile"])))
    return a / scale, scale


def predict(a_norm: np.ndarray, weights: dict) -> np.ndarray:
    """Contrast-B intensities (normalized the same way) from normalized contrast A.

    Args:
        a_norm: contrast-A volume from :func:`normalize`.
        weights: the dict returned by :func:`load`.
    """
    a = np.asarray(a_norm, dtype=np.float64)
    b = np.interp(a, weights["lut_x"], weights["lut_y"])
    b[a < float(weights["background_below"])] = 0.0
    return b
