"""Pulmonary nodule finder and structured report writer for chest CT volumes.

MedBench-Lite model ``nodule-report``; numpy only. Nodule sizes come from a partial-
volume-aware volume estimate; they are in the units of the ``spacing`` passed in. See
MODEL_CARD.md.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "find_nodules", "format_report"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _smooth2d(v: np.ndarray) -> np.ndarray:
    p = np.pad(v, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = v.shape[:2]
    return sum(p[i : i + h, j : j + w] for i in range(3) for j in range(3)) / 9.0


def _any_ahead(mask: np.ndarray, axis: int, sign: int, reach: int | None) -> np.ndarray:
    """True where ``mask`` holds further along ``axis`` in direction ``sign``."""
    m = np.moveaxis(mask, axis, 0)
    if reach is None:  # anywhere ahead
        flip = m[::-1] if sign > 0 else m
        acc = np.logical_or.accumulate(flip, axis=0)
        acc = np.concatenate([np.zeros_like(acc[:1]), acc[:-1]])
        out = acc[::-1] if sign > 0 else acc
    else:
        out = np.zeros_like(m)
        n = m.shape[0]
        for k in range(1, min(reach, n - 1) + 1):
            if sign > 0:
                out[: n - k] |= m[k:]
            else:
                out[k:] |= m[: n - k]
    return np.moveaxis(out, 0, axis)


def _label(mask: np.ndarray) -> np.ndarray:
    """6-connected component labels (0 = background) by max-label propagation."""
    lab = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:
        prev = lab
        g = lab.copy()
        for axis in range(3):
            a = np.moveaxis(g, axis, 0)
            b = np.moveaxis(lab, axis, 0)
            a[1:] = np.maximum(a[1:], b[:-1])
            a[:-1] = np.maximum(a[:-1], b[1:])
        lab = np.where(mask, g, 0)
        if np.array_equal(lab, prev):
            return lab


def _lobe(i: float, j: float, k: float, lung: np.ndarray, weights: dict) -> str:
    nx = lung.shape[0]
    right = i >= nx / 2  # RAS+: axis 0 increases toward the patient's right
    half = lung[nx // 2 :] if right else lung[: nx // 2]
    ks = np.nonzero(half.any(axis=(0, 1)))[0]
    js = np.nonzero(half.any(axis=(0, 2)))[0]
    zf = (k - ks.min()) / max(ks.max() - ks.min(), 1)
    # RAS+: axis 1 increases anteriorly; yf runs from -1 (back) to +1 (front).
    yf = (j - (js.min() + js.max()) / 2) / max((js.max() - js.min()) / 2, 1)
    if right:
        a, b, horizontal = (float(v) for v in weights["right_fissures"])
        if zf <= a + b * yf:  # below the oblique fissure
            return "right lower lobe"
        return "right upper lobe" if zf > horizontal else "right middle lobe"
    a, b = (float(v) for v in weights["left_fissure"])
    return "left upper lobe" if zf > a + b * yf else "left lower lobe"


def find_nodules(
    volume_hu: np.ndarray, weights: dict, spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)
) -> list[dict]:
    """Find lung nodules in a RAS+ ordered chest CT volume.

    Args:
        volume_hu: 3D array in Hounsfield units, axes in RAS+ order.
        weights: the dict returned by :func:`load`.
        spacing: voxel size along the three axes. Sizes are reported in these units;
            the default (1, 1, 1) is the 1 mm isotropic grid the model was tuned on.

    Returns:
        ``{"center_vox", "diameter_mm", "lobe"}`` per nodule, largest first.
    """
    v = np.asarray(volume_hu, dtype=np.float64)
    sm = _smooth2d(v)
    dark = sm < float(weights["lung_below_hu"])
    tissue = ~dark
    # Lung: dark voxels with body tissue on every in-plane side (air outside is not).
    lung = dark.copy()
    for axis in (0, 1):
        for sign in (1, -1):
            lung &= _any_ahead(tissue, axis, sign, None)
    reach = int(weights["reach_vox"])
    cand = v > float(weights["nodule_above_hu"])  # unsmoothed: small nodules must not blur away
    for axis in (0, 1):
        for sign in (1, -1):
            cand &= _any_ahead(lung, axis, sign, reach)
    lab = _label(cand)
    lung_hu, nod_hu = (float(x) for x in weights["calibration_hu"])
    voxel = float(np.prod(spacing))
    out = []
    for k in np.unique(lab[lab > 0]):
        comp = lab == k
        if comp.sum() < int(weights["min_voxels"]):
            continue
        # Partial-volume-aware size: nodule fraction summed over the component grown by one voxel.
        idx = np.argwhere(comp)
        lo = np.maximum(idx.min(axis=0) - 1, 0)
        hi = np.minimum(idx.max(axis=0) + 2, v.shape)
        box = v[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        frac = np.clip((box - lung_hu) / (nod_hu - lung_hu), 0.0, 1.0)
        volume = float(frac.sum()) * voxel
        ci, cj, ck = idx.mean(axis=0)
        out.append(
            {
                "center_vox": [round(float(ci), 1), round(float(cj), 1), round(float(ck), 1)],
                "diameter_mm": round(float(2 * (3 * volume / (4 * np.pi)) ** (1 / 3)), 1),
                "lobe": _lobe(ci, cj, ck, lung, weights),
            }
        )
    return sorted(out, key=lambda f: -f["diameter_mm"])


def format_report(case_id: str, findings: list[dict], metadata: dict) -> str:
    """The structured report text (the format task.json specifies)."""
    lines = [
        "CT CHEST REPORT",
        f"Case: {case_id}",
        f"Patient: {metadata.get('age', '?')} y, {metadata.get('sex', '?')}",
        f"Indication: {metadata.get('indication', '')}",
        "FINDINGS:",
    ]
    if not findings:
        lines.append("- No pulmonary nodules.")
        impression = "No pulmonary nodules."
    else:
        lines += [f"- Nodule: {f['lobe']}, {f['diameter_mm']:.1f} mm." for f in findings]
        big = findings[0]
        impression = f"{len(findings)} pulmonary nodule(s); largest {big['diameter_mm']:.1f} mm in the {big['lobe']}."
    lines += [f"IMPRESSION: {impression}", ""]
    return "\n".join(lines)
