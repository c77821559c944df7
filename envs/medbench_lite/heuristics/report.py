"""Model-free nodule reports: threshold the lungs, take the dense components inside them.

Sizes come from a partial-volume estimate in mm (the header's voxel size), lobes from
where a component sits in its lung: either coarse bands of the lung's height, or the
textbook fissure planes in the lung's normalized height and depth (the centre of the
positions a task draws, so the best fixed guess a reader can make).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._common import box_blur, components, enclosed

__all__ = ["HEURISTICS", "threshold_components"]


# Textbook fissures in lung-normalized coordinates (zf: 0 base .. 1 apex; yf: -1 back ..
# +1 front): the oblique fissure zf = a + b * yf, and the right horizontal fissure.
_TEXTBOOK = {"right": (0.45, -0.8, 0.64), "left": (0.52, -0.8)}


def _band_lobe(side: str, zf: float, front: bool) -> str:
    """Coarse bands: the upper lobe high, the middle lobe mid-height at the front."""
    if side == "left":
        return "upper" if zf > 0.5 else "lower"
    if zf > 0.6:
        return "upper"
    return "middle" if zf >= 0.35 and front else "lower"


def _plane_lobe(side: str, zf: float, yf: float) -> str:
    """The lobe under the textbook fissure planes."""
    a, b = _TEXTBOOK[side][:2]
    if side == "left":
        return "upper" if zf > a + b * yf else "lower"
    if zf <= a + b * yf:
        return "lower"
    return "upper" if zf > _TEXTBOOK["right"][2] else "middle"


def _findings(
    hu: np.ndarray, zooms: Sequence[float], min_voxels: int, planes: bool = False
) -> list[tuple[str, float]]:
    sm = box_blur(hu, 3, axes=(0, 1))
    dark = sm < -500
    lung = dark & enclosed(~dark, axes=(0, 1))
    if not lung.any():
        return []
    cand = (hu > -450) & enclosed(lung, axes=(0, 1))
    lab = components(cand)
    lung_hu = float(np.median(hu[lung]))
    tissue_hu = (
        float(np.median(hu[(sm > -200) & (sm < 200)])) if ((sm > -200) & (sm < 200)).any() else 40.0
    )
    voxel_ml = float(np.prod(zooms))
    mid = hu.shape[0] / 2
    out = []
    for k in range(1, int(lab.max()) + 1):
        comp = lab == k
        if comp.sum() < min_voxels:
            continue
        idx = np.argwhere(comp)
        lo = np.maximum(idx.min(axis=0) - 1, 0)
        hi = np.minimum(idx.max(axis=0) + 2, hu.shape)
        box = hu[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        frac = np.clip((box - lung_hu) / (tissue_hu - lung_hu), 0.0, 1.0)
        d = 2 * (3 * float(frac.sum()) * voxel_ml / (4 * np.pi)) ** (1 / 3)
        ci, cj, ck = idx.mean(axis=0)
        side = "right" if ci >= mid else "left"
        sl = lung[int(mid) :] if side == "right" else lung[: int(mid)]
        zs = np.nonzero(sl.any(axis=(0, 1)))[0]
        ys = np.nonzero(sl.any(axis=(0, 2)))[0]
        zf = (ck - zs.min()) / max(zs.max() - zs.min(), 1)
        yf = (cj - 0.5 * (ys.min() + ys.max())) / max(0.5 * (ys.max() - ys.min()), 1)
        lobe = _plane_lobe(side, zf, yf) if planes else _band_lobe(side, zf, yf > 0)
        out.append((f"{side} {lobe} lobe", round(d, 1)))
    return out


def threshold_components(
    workspace: Path, ids: Sequence[str], min_voxels: int = 2, planes: bool = False
) -> dict[str, dict[str, str]]:
    """One report per case from thresholded lungs and the dense components inside them.

    Args:
        workspace: the task's public files.
        ids: the case ids.
        min_voxels: the smallest component reported as a nodule, in voxels.
        planes: lobes from the textbook fissure planes (else coarse height bands).
    """
    import nibabel as nib

    ws = Path(workspace)
    (ws / "outputs" / "reports").mkdir(parents=True, exist_ok=True)
    rows = {}
    for cid in ids:
        img = nib.as_closest_canonical(nib.load(str(ws / "data" / "images" / f"{cid}.nii.gz")))
        found = _findings(img.get_fdata(), img.header.get_zooms()[:3], min_voxels, planes)
        lines = [f"- Nodule: {lobe}, {d:.1f} mm." for lobe, d in found] or [
            "- No pulmonary nodules."
        ]
        rel = f"outputs/reports/{cid}.txt"
        (ws / rel).write_text("FINDINGS:\n" + "\n".join(lines) + "\n", encoding="utf-8")
        rows[cid] = {"report_file": rel, "n_findings": str(len(found))}
    return rows


HEURISTICS = {
    "threshold_components": threshold_components,
    "threshold_components_min8": lambda ws, ids: threshold_components(ws, ids, 8),
    "textbook_fissures": lambda ws, ids: threshold_components(ws, ids, 2, planes=True),
}
