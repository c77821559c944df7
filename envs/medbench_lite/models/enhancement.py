"""Low-dose CT denoiser: an edge-preserving bilateral filter in a normalized window.

MedBench-Lite model ``ldct-bilateral``; numpy only. The range kernel is tuned in
normalized units (HU window mapped to [0, 1]); see MODEL_CARD.md.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "to_unit", "from_unit", "denoise"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def to_unit(hu: np.ndarray, weights: dict) -> np.ndarray:
    """Hounsfield units -> the model's normalized intensity (window -> [0, 1])."""
    lo, hi = (float(v) for v in weights["hu_window"])
    return (np.asarray(hu, dtype=np.float64) - lo) / (hi - lo)


def from_unit(x: np.ndarray, weights: dict) -> np.ndarray:
    """The model's normalized intensity -> Hounsfield units."""
    lo, hi = (float(v) for v in weights["hu_window"])
    return np.asarray(x, dtype=np.float64) * (hi - lo) + lo


def _bilateral(img: np.ndarray, radius: int, sigma_s: float, sigma_r: float) -> np.ndarray:
    padded = np.pad(img, radius, mode="edge")
    h, w = img.shape
    acc = np.zeros_like(img)
    norm = np.zeros_like(img)
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            nb = padded[radius + dy : radius + dy + h, radius + dx : radius + dx + w]
            wgt = np.exp(
                -(dy * dy + dx * dx) / (2 * sigma_s**2) - (nb - img) ** 2 / (2 * sigma_r**2)
            )
            acc += wgt * nb
            norm += wgt
    return acc / norm


def denoise(x: np.ndarray, weights: dict) -> np.ndarray:
    """Denoise a normalized image (2D) or slice stack (slices along the last axis).

    Args:
        x: intensities from :func:`to_unit` (the range kernel assumes that scale).
        weights: the dict returned by :func:`load`.

    Returns:
        The denoised array, same shape, still normalized (use :func:`from_unit`).
    """
    arr = np.asarray(x, dtype=np.float64)
    stack = arr[..., None] if arr.ndim == 2 else arr
    out = np.empty_like(stack)
    for k in range(stack.shape[-1]):
        img = stack[..., k]
        for _ in range(int(weights["passes"])):
            img = _bilateral(
                img,
                int(weights["radius"]),
                float(weights["sigma_spatial"]),
                float(weights["sigma_range"]),
            )
        out[..., k] = img
    return out[..., 0] if arr.ndim == 2 else out
