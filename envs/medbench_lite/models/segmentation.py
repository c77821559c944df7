"""Liver and liver-lesion segmentation for CT: intensity windows plus a side prior.

MedBench-Lite model ``liver-lesion-threshold``; numpy only. See MODEL_CARD.md for the
input convention: a Hounsfield-unit array whose voxel axes are in RAS+ order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "box_mean", "segment"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def box_mean(a: np.ndarray, size: int, axes: tuple[int, ...] = (0, 1, 2)) -> np.ndarray:
    """Mean over a ``size``-wide window along ``axes`` around each voxel (edges repeated)."""
    r = size // 2
    out = a.astype(np.float64)
    for axis in axes:
        pad = [(0, 0)] * out.ndim
        pad[axis] = (r + 1, r)
        c = np.cumsum(np.pad(out, pad, mode="edge"), axis=axis)
        n = out.shape[axis]
        out = (
            np.take(c, np.arange(size, size + n), axis=axis) - np.take(c, np.arange(n), axis=axis)
        ) / size
    return out.astype(np.float32)


def _ahead(mask: np.ndarray, axis: int, sign: int, reach: int) -> np.ndarray:
    """True where ``mask`` holds within ``reach`` voxels in direction ``sign`` on ``axis``."""
    hit = np.zeros_like(mask)
    n = mask.shape[axis]
    for k in range(1, min(reach, n - 1) + 1):
        src = [slice(None)] * mask.ndim
        dst = [slice(None)] * mask.ndim
        if sign > 0:
            src[axis], dst[axis] = slice(k, None), slice(0, n - k)
        else:
            src[axis], dst[axis] = slice(0, n - k), slice(k, None)
        hit[tuple(dst)] |= mask[tuple(src)]
    return hit


def _dilate(mask: np.ndarray, steps: int = 1) -> np.ndarray:
    """``mask`` grown by ``steps`` voxels along the three axes (6-connected, no wrap)."""
    out = mask
    for _ in range(steps):
        grown = out.copy()
        for axis in range(out.ndim):
            for sign in (1, -1):
                grown |= _ahead(out, axis, sign, 1)
        out = grown
    return out


def _cross_mean(a: np.ndarray) -> np.ndarray:
    """Mean of each voxel and its four in-plane neighbours (edges repeated)."""
    p = np.pad(a.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="edge")
    return (p[1:-1, 1:-1] + p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:]) / 5.0


def segment(volume_hu: np.ndarray, spacing_mm: tuple[float, ...], weights: dict) -> np.ndarray:
    """Label liver (1) and lesions (2) in a RAS+ ordered CT volume.

    Args:
        volume_hu: 3D array in Hounsfield units, axes in RAS+ order (axis 0 runs from
            the patient's left to the patient's right).
        spacing_mm: voxel size in mm along the same three axes.
        weights: the dict returned by :func:`load`.

    Returns:
        uint8 labels, same shape and voxel order as ``volume_hu``.
    """
    vol = np.asarray(volume_hu, dtype=np.float32)
    size = int(weights["smooth"])
    sm = box_mean(vol, size)
    # In-plane smoothing only for the lesion decision: lesions are a few voxels thick
    # along the slice axis, and a 3D window would shrink them.
    sm2d = box_mean(vol, size, axes=(0, 1))
    # The liver lies on the patient's right: the high half of axis 0 in RAS+ order.
    side = np.zeros(vol.shape, dtype=bool)
    side[vol.shape[0] // 2 :] = True
    lo, hi = (float(v) for v in weights["tissue_hu"])
    # Bone, and fat right next to it (whose smoothed values look like soft tissue), is
    # never liver.
    near_bone = _dilate(vol > hi, int(weights["bone_margin"]))
    tissue = (sm >= lo) & (sm <= hi) & side & ~near_bone
    core = tissue & (sm >= float(weights["parenchyma_hu"]))
    # A lesion is hypodense tissue enclosed by liver parenchyma in all six directions;
    # the organ's own blurred rim is hypodense too but never enclosed.
    lesion = tissue & (sm2d < float(weights["parenchyma_hu"]))
    for axis in range(3):
        reach = max(1, int(round(float(weights["enclose_mm"]) / float(spacing_mm[axis]))))
        for sign in (1, -1):
            lesion &= _ahead(core, axis, sign, reach)
    # Drop isolated noise voxels: a lesion voxel needs lesion voxels around it.
    lesion &= box_mean(lesion.astype(np.float32), 3) >= float(weights["lesion_support"])
    # The box means blur every boundary by about a voxel. Redraw the liver's edge with
    # a five-voxel in-plane mean, one voxel either side of the blurred edge.
    fine = _cross_mean(vol)
    liver = (fine >= lo) & (fine <= hi) & side & ~near_bone & _dilate(tissue)
    liver |= tissue & lesion
    # Grow each lesion into neighbouring voxels darker than the midpoint between this
    # volume's lesion and parenchyma intensities: small lesions lose most to the blur.
    parenchyma = core & ~_dilate(lesion, 2)
    if lesion.any() and parenchyma.any():
        cut = 0.5 * (float(np.median(vol[lesion])) + float(np.median(vol[parenchyma])))
        for _ in range(int(weights["lesion_grow"])):
            lesion |= _dilate(lesion) & liver & (vol < cut)
    labels = np.zeros(vol.shape, dtype=np.uint8)
    labels[liver] = 1
    labels[lesion] = 2
    return labels
