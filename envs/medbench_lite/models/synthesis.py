"""MR contrast translation (A -> B): foreground normalization plus a learned lookup table.

MedBench-Lite model ``mr-lut``; numpy only. Images are smoothed in-plane before the
table so that scanner noise is not mapped voxel by voxel into the output; the table
was fitted on smoothed, normalized intensities. See MODEL_CARD.md for the input
convention.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "normalize", "smooth", "predict"]


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


def smooth(a: np.ndarray, weights: dict) -> np.ndarray:
    """``a`` filtered in-plane (axes 0 and 1) with the separable kernel ``smooth_kernel``.

    Arrays of fewer than two dimensions (a list of probe values) are returned as they
    are: there is no plane to smooth in. Edges are repeated.
    """
    out = np.asarray(a, dtype=np.float64)
    kernel = np.asarray(weights["smooth_kernel"], dtype=np.float64)
    r = len(kernel) // 2
    for axis in range(min(out.ndim, 2)):
        pad = [(0, 0)] * out.ndim
        pad[axis] = (r, r)
        padded = np.pad(out, pad, mode="edge")
        n = out.shape[axis]
        out = sum(w * np.take(padded, np.arange(k, k + n), axis=axis) for k, w in enumerate(kernel))
    return out


def predict(a_norm: np.ndarray, weights: dict) -> np.ndarray:
    """Contrast-B intensities (normalized the same way) from normalized contrast A.

    Args:
        a_norm: contrast-A volume from :func:`normalize`; images and volumes are
            smoothed in-plane (:func:`smooth`) before the lookup table.
        weights: the dict returned by :func:`load`.
    """
    a = smooth(a_norm, weights)
    b = np.interp(a, weights["lut_x"], weights["lut_y"])
    b[a < float(weights["background_below"])] = 0.0
    return b
