"""Liver and liver-lesion segmentation for CT: intensity windows, a side prior and texture.

MedBench-Lite model ``liver-lesion-texture``; numpy only. The liver is told from the
abutting organs of the same density by its parenchymal stripe texture, and lesions
from look-alike hypodense foci by theirs: both signatures (stripe orientation and
period on the RAS+ voxel grid) are held in the weights. See MODEL_CARD.md for the
input convention: a Hounsfield-unit array whose voxel axes are in RAS+ order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "box_mean", "texture_energy", "label_components", "segment"]


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


def _phase(shape: tuple[int, ...], texture: np.ndarray) -> np.ndarray:
    """Stripe phase (radians) per voxel for ``texture = [theta, period_voxels]``."""
    theta, period = float(texture[0]), float(texture[1])
    i = np.arange(shape[0], dtype=np.float64)[:, None, None]
    j = np.arange(shape[1], dtype=np.float64)[None, :, None]
    return 2 * np.pi * (i * np.cos(theta) + j * np.sin(theta)) / period + np.zeros(shape)


def texture_energy(
    hp: np.ndarray, mask: np.ndarray, texture: np.ndarray, window: np.ndarray
) -> np.ndarray:
    """Local energy (HU^2) of the stripe ``texture`` in the masked, zero-mean volume ``hp``.

    Complex demodulation: ``hp`` is multiplied by ``exp(-i phase)`` and averaged over a
    ``window`` (voxels per axis) box, counting only voxels in ``mask`` (normalised
    convolution, so the energy holds up to the organ's edge). Stripes of amplitude ``a``
    at this orientation and period give about ``(a / 2) ** 2``; other orientations and
    white noise give little.
    """
    ph = _phase(hp.shape, texture)
    m = mask.astype(np.float64)
    w = np.maximum(_box(m, window), 1e-3)
    re = _box(hp * np.cos(ph) * m, window) / w
    im = _box(hp * np.sin(ph) * m, window) / w
    return (re**2 + im**2) * (w > 0.2)


def _box(a: np.ndarray, window: np.ndarray) -> np.ndarray:
    out = a
    for axis, size in enumerate(np.asarray(window, dtype=int)):
        out = box_mean(out, int(size), axes=(axis,)).astype(np.float64)
    return out


def label_components(mask: np.ndarray) -> np.ndarray:
    """6-connected component labels (0 = background) by propagating the max label."""
    lab = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:
        grown = lab.copy()
        for axis in range(lab.ndim):
            n = lab.shape[axis]
            lo = [slice(None)] * lab.ndim
            hi = [slice(None)] * lab.ndim
            lo[axis], hi[axis] = slice(0, n - 1), slice(1, n)
            grown[tuple(hi)] = np.maximum(grown[tuple(hi)], lab[tuple(lo)])
            grown[tuple(lo)] = np.maximum(grown[tuple(lo)], lab[tuple(hi)])
        grown = np.where(mask, grown, 0)
        if np.array_equal(grown, lab):
            return lab
        lab = grown


def _enclosed(mask: np.ndarray, spacing_mm, reach_mm: float, sides: int = 6) -> np.ndarray:
    """Voxels with ``mask`` within ``reach_mm`` in at least ``sides`` of the six directions."""
    count = np.zeros(mask.shape, dtype=np.int8)
    for axis in range(3):
        reach = max(1, int(round(reach_mm / float(spacing_mm[axis]))))
        for sign in (1, -1):
            count += _ahead(mask, axis, sign, reach)
    return count >= sides


def segment(volume_hu: np.ndarray, spacing_mm: tuple[float, ...], weights: dict) -> np.ndarray:
    """Label liver (1) and lesions (2) in a RAS+ ordered CT volume.

    Args:
        volume_hu: 3D array in Hounsfield units, axes in RAS+ order (axis 0 runs from
            the patient's left to the patient's right, axis 1 to anterior).
        spacing_mm: voxel size in mm along the same three axes.
        weights: the dict returned by :func:`load`.

    Returns:
        uint8 labels, same shape and voxel order as ``volume_hu``.
    """
    vol = np.asarray(volume_hu, dtype=np.float32)
    size = int(weights["smooth"])
    sm = box_mean(vol, size)
    # The liver lies on the patient's right: the high half of axis 0 in RAS+ order.
    side = np.zeros(vol.shape, dtype=bool)
    side[vol.shape[0] // 2 :] = True
    lo, hi = (float(v) for v in weights["tissue_hu"])
    # Bone, and fat right next to it (whose smoothed values look like soft tissue), is
    # never liver.
    near_bone = _dilate(vol > hi, int(weights["bone_margin"]))
    tissue = (sm >= lo) & (sm <= hi) & side & ~near_bone
    fine = _cross_mean(vol)
    soft = (fine >= lo) & (fine <= hi) & ~near_bone
    # Parenchymal texture: the liver's stripes against those of the abutting organs of
    # the same density. Local mean removed inside soft tissue only, so the fat edge
    # does not ring into the texture band.
    window = np.asarray(weights["texture_window"])
    m = soft.astype(np.float64)
    local = _box(vol * m, window) / np.maximum(_box(m, window), 1e-3)
    hp = (vol - local) * m
    e_liver = texture_energy(hp, soft, weights["liver_texture"], window)
    ref = e_liver[tissue]
    plateau = float(np.quantile(ref, 0.95)) if ref.size else 0.0
    # Quarter of the plateau energy is half the stripe amplitude: the edge of a
    # textured region, unbiased by the window's width. A majority vote over 3 x 3 x 3
    # voxels then smooths the edge's jitter.
    textured = tissue & (e_liver > float(weights["texture_floor"]) * plateau)
    # The vote counts soft-tissue voxels only, so it does not erode the fat edge.
    votes = box_mean(textured.astype(np.float32), 3)
    textured = tissue & (votes >= 0.5 * box_mean(soft.astype(np.float32), 3))
    lab = label_components(textured)
    if lab.max() == 0:
        return np.zeros(vol.shape, dtype=np.uint8)
    counts = np.bincount(lab.ravel())
    counts[0] = 0
    core = lab == int(np.argmax(counts))
    # Foci inside the liver carry their own texture: fill what the liver encloses.
    reach = float(weights["enclose_mm"])
    # A focus near the liver's edge has liver on four or five sides, a focus in an
    # abutting organ on one or two.
    inside = _enclosed(core, spacing_mm, reach, int(weights["enclose_sides"])) & ~core & side
    # The 3D mean's window shaves the soft-tissue edge against fat: soft voxels next
    # to the core that no other texture claims belong to it.
    liver = (core & soft) | inside | (_dilate(core) & soft & ~tissue)
    # Lesion candidates: liver voxels darker than the parenchyma (the texture window
    # reaches a voxel or two into a focus, so the core may hold its rim; next to fat
    # the mean drops too, so a focus lies a voxel or more inside the soft tissue).
    par = float(np.median(vol[core])) if core.any() else float(weights["parenchyma_hu"])
    dark = liver & ~_dilate(~soft) & (sm < par - float(weights["lesion_margin_hu"]))
    # One voxel eroded: the 3D mean's spread is gone, and neighbouring foci bridged by
    # it come apart. Each seed is regrown over the dark voxels and its edge redrawn at
    # the midpoint between its own and the parenchyma's intensity on the five-voxel
    # in-plane mean, so the texture test reads the whole focus and nothing around it.
    comp = label_components(dark & ~_dilate(~dark))
    lesion = np.zeros(vol.shape, dtype=bool)
    theta, period = (float(v) for v in weights["lesion_texture"])
    for k in np.unique(comp[comp > 0]):
        seed = comp == k
        if seed.sum() < int(weights["lesion_min_voxels"]):
            continue
        focus = seed
        for _ in range(2):
            focus = focus | (_dilate(focus) & dark)
        cut = 0.5 * (float(np.median(fine[seed])) + par)
        focus = _dilate(focus, int(weights["lesion_grow"])) & liver & (fine < cut)
        # The texture is read in a ball of the focus's size at its centre, weighted by
        # a Gaussian: the focus's own voxels, picked by intensity, would favour its
        # dark stripes, and its rim would add the parenchyma's stripes.
        idx = np.argwhere(focus)
        step = np.asarray(spacing_mm[:3], dtype=np.float64)
        radius = (3.0 * len(idx) * float(np.prod(step)) / (4.0 * np.pi)) ** (1.0 / 3.0)
        lo_i = np.maximum(idx.min(axis=0) - 1, 0)
        hi_i = np.minimum(idx.max(axis=0) + 2, vol.shape)
        box = tuple(slice(int(p), int(q)) for p, q in zip(lo_i, hi_i, strict=True))
        grid = np.stack(
            np.meshgrid(*[np.arange(sl.start, sl.stop) for sl in box], indexing="ij"), -1
        )
        d2 = (((grid - idx.mean(axis=0)) * step) ** 2).sum(axis=-1)
        w = np.exp(-0.5 * d2 / (0.6 * radius) ** 2) * (d2 <= radius**2)
        w = w / w.sum()
        v = vol[box] - float((w * vol[box]).sum())
        # Matched filter against an orientation bank at the lesion's period: the
        # focus's stripes point where the bank answers most, and a lesion's lie within
        # lesion_tolerance (radians) of the lesion orientation ...
        angles = np.linspace(-np.pi / 2, np.pi / 2, 72, endpoint=False)
        gi, gj = grid[..., 0].astype(np.float64), grid[..., 1].astype(np.float64)
        bank = [
            abs(
                (
                    w
                    * v
                    * np.exp(
                        -2j * np.pi * (gi * np.cos(theta + a) + gj * np.sin(theta + a)) / period
                    )
                ).sum()
            )
            ** 2
            for a in angles
        ]
        best = int(np.argmax(bank))
        # ... and answer clearly above what noise alone gives this weighted mean.
        floor = float(weights["lesion_snr"]) * float((w * v**2).sum()) * float((w**2).sum())
        if abs(angles[best]) < float(weights["lesion_tolerance"]) and bank[best] > floor:
            lesion |= focus
    labels = np.zeros(vol.shape, dtype=np.uint8)
    labels[liver] = 1
    labels[lesion] = 2
    return labels
