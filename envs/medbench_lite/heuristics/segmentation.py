"""Model-free segmentations: intensity thresholds, connected components, texture, anatomy.

What a careful reader of the images could do without the provided model: reorient to
RAS+ (so the patient's right is known), keep the largest soft-tissue component on the
right as the liver, and call the hypodense voxels enclosed by it lesions
(``threshold_components``; ``mass_dark_foci`` keeps every dark focus of the mass with
a midpoint edge). The texture variant goes further: it finds the stripe textures of
the right-sided soft tissue in their power spectrum, takes the strongest (the organ
with the most textured volume) for the liver's, and keeps the region where that
texture dominates, after a morphological opening that cuts thin bridges
(``dominant_texture``). None knows which texture is the liver's or the lesions':
that is what the provided model's weights hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._common import (
    box_blur,
    components,
    enclosed,
    largest_component,
)

__all__ = ["HEURISTICS", "threshold_components", "dominant_texture", "mass_dark_foci"]


def _segment(hu: np.ndarray, tissue_hu: tuple[float, float], lesion_margin_hu: float) -> np.ndarray:
    sm = box_blur(hu, 3)
    right = np.zeros(hu.shape, dtype=bool)
    right[hu.shape[0] // 2 :] = True  # RAS+: the high half of axis 0 is the patient's right
    tissue = (sm >= tissue_hu[0]) & (sm <= tissue_hu[1]) & right
    liver = largest_component(tissue)
    if not liver.any():
        return np.zeros(hu.shape, dtype=np.uint8)
    inside = enclosed(liver, axes=(0, 1, 2)) & ~liver
    cut = float(np.median(hu[liver])) - lesion_margin_hu
    dark = inside & (box_blur(hu, 3, axes=(0, 1)) < cut)
    lab = components(dark)
    lesion = np.zeros(hu.shape, dtype=bool)
    if lab.max():
        counts = np.bincount(lab.ravel())
        for k in np.nonzero(counts >= 8)[0][1:]:
            lesion |= lab == k
    out = np.zeros(hu.shape, dtype=np.uint8)
    out[liver | lesion] = 1
    out[lesion] = 2
    return out


def _opening(mask: np.ndarray, steps: int) -> np.ndarray:
    """Erode then dilate ``steps`` times (6-connected): thin bridges between blobs go."""
    out = mask
    for _ in range(steps):
        out = box_blur(out.astype(np.float64), 3) > 0.999
    for _ in range(steps):
        out = box_blur(out.astype(np.float64), 3) > 0.001
    return out & mask


def _texture_segment(hu: np.ndarray, tissue_hu: tuple[float, float], opening: int) -> np.ndarray:
    sm = box_blur(hu, 3)
    right = np.zeros(hu.shape, dtype=bool)
    right[hu.shape[0] // 2 :] = True
    soft = (sm >= tissue_hu[0]) & (sm <= tissue_hu[1])
    mass = largest_component(soft & right)
    if not mass.any():
        return np.zeros(hu.shape, dtype=np.uint8)
    # Zero-mean texture inside the mass, then its in-plane power spectrum summed over
    # slices: each organ's stripes make a peak; the strongest is the largest organ.
    m = mass.astype(np.float64)
    local = box_blur(hu * m, 5) / np.maximum(box_blur(m, 5), 1e-3)
    hp = (hu - local) * m
    power = (np.abs(np.fft.fft2(hp, axes=(0, 1))) ** 2).sum(axis=2)
    fi = np.fft.fftfreq(hu.shape[0])[:, None]
    fj = np.fft.fftfreq(hu.shape[1])[None, :]
    band = (np.hypot(fi, fj) > 0.15) & (np.hypot(fi, fj) < 0.35)
    k = np.unravel_index(np.argmax(np.where(band, power, 0.0)), power.shape)
    i = np.arange(hu.shape[0])[:, None, None]
    j = np.arange(hu.shape[1])[None, :, None]
    ph = 2 * np.pi * (fi[k[0], 0] * i + fj[0, k[1]] * j) + np.zeros(hu.shape)
    w = np.maximum(box_blur(m, 5), 1e-3)
    energy = (box_blur(hp * np.cos(ph), 5) / w) ** 2 + (box_blur(hp * np.sin(ph), 5) / w) ** 2
    plateau = float(np.quantile(energy[mass], 0.95))
    organ = mass & (energy > 0.25 * plateau)
    organ = largest_component(_opening(organ, opening) if opening else organ)
    if not organ.any():
        return np.zeros(hu.shape, dtype=np.uint8)
    # Foci carry another texture: what the organ encloses on most sides joins it.
    count = sum(
        np.flip(np.maximum.accumulate(np.flip(organ, a), axis=a), a).astype(np.int8)
        + np.maximum.accumulate(organ, axis=a).astype(np.int8)
        for a in range(3)
    )
    liver = organ | (mass & (count >= 5))
    cut = float(np.median(hu[organ])) - 12.0
    dark = liver & ~organ & (sm < cut)
    lab = components(dark)
    lesion = np.zeros(hu.shape, dtype=bool)
    if lab.max():
        counts = np.bincount(lab.ravel())
        for c in np.nonzero(counts >= 40)[0][1:]:
            lesion |= lab == c
    out = np.zeros(hu.shape, dtype=np.uint8)
    out[liver | lesion] = 1
    out[lesion] = 2
    return out


def _mass_segment(hu: np.ndarray, tissue_hu: tuple[float, float], margin_hu: float) -> np.ndarray:
    sm = box_blur(hu, 3)
    right = np.zeros(hu.shape, dtype=bool)
    right[hu.shape[0] // 2 :] = True
    mass = largest_component((sm >= tissue_hu[0]) & (sm <= tissue_hu[1]) & right)
    if not mass.any():
        return np.zeros(hu.shape, dtype=np.uint8)
    # Dark foci inside the mass: what it encloses on five of six sides, or its own
    # voxels darker than the parenchyma, one voxel in from the fat.
    count = sum(
        np.flip(np.maximum.accumulate(np.flip(mass, a), axis=a), a).astype(np.int8)
        + np.maximum.accumulate(mass, axis=a).astype(np.int8)
        for a in range(3)
    )
    liver = mass | (count >= 5)
    inner = liver & (box_blur(liver.astype(np.float64), 3) > 0.999)
    par = float(np.median(hu[mass]))
    dark = inner & (sm < par - margin_hu)
    seeds = components(dark & (box_blur(dark.astype(np.float64), 3) > 0.999))
    lesion = np.zeros(hu.shape, dtype=bool)
    if seeds.max():
        counts = np.bincount(seeds.ravel())
        for c in np.nonzero(counts >= 10)[0][1:]:
            lesion |= seeds == c
    # Regrow over the dark voxels, then cut at the midpoint between focus and parenchyma.
    for _ in range(2):
        lesion |= (box_blur(lesion.astype(np.float64), 3) > 0.001) & dark
    if lesion.any():
        fine = box_blur(hu, 3, axes=(0, 1))
        cut = 0.5 * (float(np.median(hu[lesion])) + par)
        lesion = (box_blur(lesion.astype(np.float64), 3) > 0.001) & liver & (fine < cut)
    out = np.zeros(hu.shape, dtype=np.uint8)
    out[liver | lesion] = 1
    out[lesion] = 2
    return out


def mass_dark_foci(
    workspace: Path,
    ids: Sequence[str],
    tissue_hu: tuple[float, float] = (-15.0, 200.0),
    margin_hu: float = 12.0,
) -> dict[str, dict[str, str]]:
    """Liver: the whole right-sided soft-tissue mass; lesions: every dark focus inside it."""
    return _save_rows(workspace, ids, lambda hu: _mass_segment(hu, tissue_hu, margin_hu))


def _save_rows(workspace: Path, ids: Sequence[str], segment) -> dict[str, dict[str, str]]:
    import nibabel as nib

    ws = Path(workspace)
    rows = {}
    for cid in ids:
        img = nib.load(str(ws / "data" / "images" / f"{cid}.nii.gz"))
        can = nib.as_closest_canonical(img)
        labels = segment(can.get_fdata())
        back = nib.Nifti1Image(labels, can.affine).as_reoriented(nib.io_orientation(img.affine))
        out = nib.Nifti1Image(np.asarray(back.dataobj, dtype=np.uint8), img.affine)
        out.set_sform(img.affine, code=1)
        out.set_qform(img.affine, code=1)
        rel = f"outputs/masks/{cid}.nii.gz"
        (ws / "outputs" / "masks").mkdir(parents=True, exist_ok=True)
        nib.save(out, str(ws / rel))
        rows[cid] = {"mask_file": rel, "liver_ml": "", "lesion_ml": ""}
    return rows


def dominant_texture(
    workspace: Path,
    ids: Sequence[str],
    tissue_hu: tuple[float, float] = (20.0, 150.0),
    opening: int = 1,
) -> dict[str, dict[str, str]]:
    """Liver: where the right-sided soft tissue's strongest stripe texture dominates."""
    return _save_rows(workspace, ids, lambda hu: _texture_segment(hu, tissue_hu, opening))


def threshold_components(
    workspace: Path,
    ids: Sequence[str],
    tissue_hu: tuple[float, float] = (40.0, 120.0),
    lesion_margin_hu: float = 25.0,
) -> dict[str, dict[str, str]]:
    """Liver: largest right-sided soft-tissue component; lesions: dark voxels inside it."""
    import nibabel as nib

    ws = Path(workspace)
    rows = {}
    for cid in ids:
        img = nib.load(str(ws / "data" / "images" / f"{cid}.nii.gz"))
        can = nib.as_closest_canonical(img)
        labels = _segment(can.get_fdata(), tissue_hu, lesion_margin_hu)
        back = nib.Nifti1Image(labels, can.affine).as_reoriented(nib.io_orientation(img.affine))
        out = nib.Nifti1Image(np.asarray(back.dataobj, dtype=np.uint8), img.affine)
        out.set_sform(img.affine, code=1)
        out.set_qform(img.affine, code=1)
        rel = f"outputs/masks/{cid}.nii.gz"
        (ws / "outputs" / "masks").mkdir(parents=True, exist_ok=True)
        nib.save(out, str(ws / rel))
        rows[cid] = {"mask_file": rel, "liver_ml": "", "lesion_ml": ""}
    return rows


HEURISTICS = {
    "threshold_components": threshold_components,
    "threshold_components_wide": lambda ws, ids: threshold_components(ws, ids, (20.0, 150.0), 15.0),
    "mass_dark_foci": mass_dark_foci,
    "dominant_texture": dominant_texture,
    "dominant_texture_open2": lambda ws, ids: dominant_texture(ws, ids, opening=2),
}
