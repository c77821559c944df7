"""Model-free denoisers for the enhancement track: linear, rank and edge-preserving filters in HU.

The bilateral filter is the textbook edge-preserving denoiser (Tomasi and Manduchi,
1998), written here from scratch with a range kernel in HU: what a reader who knows the
literature could run without the provided model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._common import gaussian_blur, save_like

__all__ = ["HEURISTICS", "bilateral", "gaussian", "median"]


def _run(workspace: Path, ids: Sequence[str], fn) -> dict[str, dict[str, str]]:
    import nibabel as nib

    ws = Path(workspace)
    rows = {}
    for cid in ids:
        img = nib.load(str(ws / "data" / "images" / f"{cid}.nii.gz"))
        rel = f"outputs/denoised/{cid}.nii.gz"
        save_like(img, fn(img.get_fdata()), ws / rel)
        rows[cid] = {"output_file": rel}
    return rows


def _median3(a: np.ndarray) -> np.ndarray:
    p = np.pad(a, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = a.shape[:2]
    stack = [p[i : i + h, j : j + w] for i in range(3) for j in range(3)]
    return np.median(np.stack(stack), axis=0)


def gaussian(workspace: Path, ids: Sequence[str], sigma_px: float = 1.0) -> dict:
    """Each slice smoothed with a Gaussian of ``sigma_px`` pixels, in HU."""
    return _run(workspace, ids, lambda hu: gaussian_blur(hu, sigma_px))


def median(workspace: Path, ids: Sequence[str]) -> dict:
    """Each slice through a 3 x 3 median filter, twice."""
    return _run(workspace, ids, lambda hu: _median3(_median3(hu)))


def _bilateral2d(img: np.ndarray, radius: int, sigma_px: float, sigma_hu: float) -> np.ndarray:
    """One bilateral pass over a 2D slice (HU in, HU out; edges repeated)."""
    padded = np.pad(img, radius, mode="edge")
    h, w = img.shape
    acc = np.zeros_like(img)
    norm = np.zeros_like(img)
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            nb = padded[radius + dy : radius + dy + h, radius + dx : radius + dx + w]
            wgt = np.exp(
                -(dy * dy + dx * dx) / (2 * sigma_px**2) - (nb - img) ** 2 / (2 * sigma_hu**2)
            )
            acc += wgt * nb
            norm += wgt
    return acc / norm


def bilateral(
    workspace: Path,
    ids: Sequence[str],
    radius: int = 3,
    sigma_px: float = 2.0,
    sigma_hu: float = 100.0,
    passes: int = 2,
) -> dict:
    """Each slice through ``passes`` bilateral passes (range kernel ``sigma_hu`` in HU)."""

    def run(hu: np.ndarray) -> np.ndarray:
        out = np.empty_like(hu)
        for k in range(hu.shape[-1]):
            img = hu[..., k].astype(np.float64)
            for _ in range(passes):
                img = _bilateral2d(img, radius, sigma_px, sigma_hu)
            out[..., k] = img
        return out

    return _run(workspace, ids, run)


HEURISTICS = {
    # The model's own window in HU units, and a wider one that does better on heavy noise.
    "bilateral_5x5": lambda ws, ids: bilateral(ws, ids, 2, 1.5),
    "bilateral_7x7": bilateral,
    "gaussian_0.7": lambda ws, ids: gaussian(ws, ids, 0.7),
    "gaussian_1.0": lambda ws, ids: gaussian(ws, ids, 1.0),
    "gaussian_1.5": lambda ws, ids: gaussian(ws, ids, 1.5),
    "median_3x3_twice": median,
}
