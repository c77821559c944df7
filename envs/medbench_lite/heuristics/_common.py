"""Plain numpy image operations the model-free heuristics share (no model code)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.metrics import box_filter

__all__ = [
    "box_blur",
    "gaussian_blur",
    "components",
    "largest_component",
    "enclosed",
    "case_inputs",
    "save_like",
]


def box_blur(a: np.ndarray, size: int, axes: tuple[int, ...] | None = None) -> np.ndarray:
    """Mean over a ``size``-wide window along ``axes`` (all by default), edges repeated."""
    return box_filter(a, size, range(np.ndim(a)) if axes is None else axes)


def gaussian_blur(a: np.ndarray, sigma_px: float, axes: tuple[int, ...] = (0, 1)) -> np.ndarray:
    """Separable Gaussian filter (``sigma_px`` pixels, kernel to 3 sigma) along ``axes``."""
    out = np.asarray(a, dtype=np.float64)
    if sigma_px <= 0:
        return out
    r = max(1, int(np.ceil(3 * sigma_px)))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma_px) ** 2)
    k /= k.sum()
    for axis in axes:
        pad = [(0, 0)] * out.ndim
        pad[axis] = (r, r)
        p = np.pad(out, pad, mode="edge")
        n = out.shape[axis]
        out = sum(w * np.take(p, np.arange(i, i + n), axis=axis) for i, w in enumerate(k))
    return out


def components(mask: np.ndarray) -> np.ndarray:
    """6-connected component labels of a boolean volume (0 = background), by propagation."""
    mask = np.asarray(mask, dtype=bool)
    lab = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:
        new = lab.copy()
        for axis in range(mask.ndim):
            for shift in (1, -1):
                moved = np.roll(lab, shift, axis=axis)
                edge = [slice(None)] * mask.ndim
                edge[axis] = 0 if shift == 1 else -1
                moved[tuple(edge)] = 0  # no wrap-around
                new = np.maximum(new, moved)
        new = np.where(mask, new, 0)
        if np.array_equal(new, lab):
            break
        lab = new
    _, inverse = np.unique(lab, return_inverse=True)
    return inverse.reshape(mask.shape)


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 6-connected component of ``mask`` (empty if ``mask`` is)."""
    lab = components(mask)
    if lab.max() == 0:
        return np.zeros(mask.shape, dtype=bool)
    counts = np.bincount(lab.ravel())
    counts[0] = 0
    return lab == int(np.argmax(counts))


def enclosed(mask: np.ndarray, axes: tuple[int, ...] = (0, 1)) -> np.ndarray:
    """Voxels with ``mask`` somewhere ahead of them in both directions of every axis."""
    out = np.ones(mask.shape, dtype=bool)
    for axis in axes:
        fwd = np.flip(np.maximum.accumulate(np.flip(mask, axis), axis=axis), axis)
        bwd = np.maximum.accumulate(mask, axis=axis)
        out &= fwd & bwd
    return out


def case_inputs(workspace: Path) -> dict:
    """``task.json`` of the workspace."""
    return json.loads((Path(workspace) / "task.json").read_text())


def save_like(img, data: np.ndarray, path: Path, dtype=np.float32) -> str:
    """Save ``data`` as NIfTI with ``img``'s affine; the path relative to the workspace root."""
    import nibabel as nib

    out = nib.Nifti1Image(np.asarray(data).astype(dtype), img.affine)
    out.set_sform(img.affine, code=1)
    out.set_qform(img.affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(out, str(path))
    return str(path)
