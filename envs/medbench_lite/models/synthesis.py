"""MR contrast translation (A -> B): foreground normalization plus a learned lookup table.

MedBench-Lite model ``mr-lut``; numpy only. Images are smoothed in-plane before the
table so that scanner noise is not mapped voxel by voxel into the output; the table
was fitted on smoothed, normalized intensities. See MODEL_CARD.md for the input
convention.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "normalize", "smooth", "depth", "predict"]


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


def _enclosed(mask: np.ndarray) -> np.ndarray:
    """Voxels with ``mask`` on both sides along each in-plane axis (holes filled)."""
    out = np.ones(mask.shape, dtype=bool)
    for axis in (0, 1):
        fwd = np.flip(np.logical_or.accumulate(np.flip(mask, axis), axis=axis), axis)
        out &= fwd & np.logical_or.accumulate(mask, axis=axis)
    return out


def depth(a: np.ndarray, weights: dict) -> np.ndarray:
    """In-plane depth of each voxel below the head's surface, in voxels (0 outside).

    The head is every voxel above ``background_below`` with its holes filled (the skull
    is dark in contrast A); depth counts the erosions a voxel survives (4-neighbour in
    plane, and across slices every ``depth_z_every``-th step, the slice thickness in
    in-plane voxels), capped at the table's last depth row.
    """
    head = _enclosed(np.asarray(a) > float(weights["background_below"]))
    cap = int(np.asarray(weights["lut_y"]).shape[0]) - 1
    d = np.zeros(head.shape, dtype=np.int64)
    cur = head
    z_every = int(weights["depth_z_every"])
    for step in range(cap):
        d += cur
        p = np.pad(cur, [(1, 1), (1, 1)] + [(0, 0)] * (cur.ndim - 2))
        cur = cur & p[:-2, 1:-1] & p[2:, 1:-1] & p[1:-1, :-2] & p[1:-1, 2:]
        if cur.ndim == 3 and step % z_every == z_every - 1:
            # Slices are thicker than the in-plane voxels: erode across them less often.
            q = np.pad(cur, [(0, 0), (0, 0), (1, 1)])
            cur = cur & q[:, :, :-2] & q[:, :, 2:]
    return d


def predict(a_norm: np.ndarray, weights: dict) -> np.ndarray:
    """Contrast-B intensities (normalized the same way) from normalized contrast A.

    Args:
        a_norm: contrast-A volume from :func:`normalize`; images and volumes are
            smoothed in-plane (:func:`smooth`) before the lookup table.
        weights: the dict returned by :func:`load`.

    The table has one row per depth below the head's surface (:func:`depth`): scalp
    fat and white matter are both bright in contrast A, and only where a voxel lies
    tells them apart. A list of probe values (fewer than two axes) is read as deep
    tissue.
    """
    a = smooth(a_norm, weights)
    table = np.asarray(weights["lut_y"], dtype=np.float64)
    d = depth(a, weights) if a.ndim >= 2 else np.full(a.shape, table.shape[0] - 1)
    b = np.zeros(a.shape, dtype=np.float64)
    for k in range(table.shape[0]):
        sel = d == k
        b[sel] = np.interp(a[sel], weights["lut_x"], table[k])
    b[d == 0] = 0.0
    return b
