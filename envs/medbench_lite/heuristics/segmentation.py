"""Model-free segmentations: intensity thresholds, connected components and anatomy.

What a careful reader of the images could do without the provided model: reorient to
RAS+ (so the patient's right is known), keep the largest soft-tissue component on the
right as the liver, and call the hypodense voxels enclosed by it lesions.
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

__all__ = ["HEURISTICS", "threshold_components"]


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
}
