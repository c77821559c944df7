"""Model-free denoisers for the enhancement track: linear and rank filters in HU."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._common import gaussian_blur, save_like

__all__ = ["HEURISTICS", "gaussian", "median"]


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


HEURISTICS = {
    "gaussian_0.7": lambda ws, ids: gaussian(ws, ids, 0.7),
    "gaussian_1.0": lambda ws, ids: gaussian(ws, ids, 1.0),
    "gaussian_1.5": lambda ws, ids: gaussian(ws, ids, 1.5),
    "median_3x3_twice": median,
}
