"""Model-free contrast translations: an inverted, smoothed input and a table fitted on the pairs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._common import gaussian_blur, save_like

__all__ = ["HEURISTICS", "negated_blur", "pair_table"]


def _head(a: np.ndarray) -> np.ndarray:
    return a > 0.1 * np.percentile(a, 99.5)


def _norm(a: np.ndarray) -> np.ndarray:
    head = _head(a)
    return a / max(float(np.percentile(a[head], 95)), 1e-9) if head.any() else a


def _run(workspace: Path, ids: Sequence[str], fn) -> dict[str, dict[str, str]]:
    import nibabel as nib

    ws = Path(workspace)
    rows = {}
    for cid in ids:
        img = nib.load(str(ws / "data" / "test" / f"{cid}_A.nii.gz"))
        a = img.get_fdata()
        rel = f"outputs/synth/{cid}.nii.gz"
        save_like(img, fn(a), ws / rel)
        rows[cid] = {"output_file": rel}
    return rows


def negated_blur(workspace: Path, ids: Sequence[str], sigma_px: float = 1.0) -> dict:
    """B = (max - A), smoothed, inside the head; 0 outside: dark in A is bright in B."""

    def fn(a):
        head = _head(a)
        n = _norm(gaussian_blur(a, sigma_px))
        return np.where(head, np.clip(1.6 - n, 0.05, None), 0.0)

    return _run(workspace, ids, fn)


def pair_table(workspace: Path, ids: Sequence[str], bins: int = 48) -> dict:
    """A lookup table from normalized, smoothed A to B/mean(B), fitted on the training pairs."""
    import nibabel as nib

    ws = Path(workspace)
    xs, ys = [], []
    for path in sorted((ws / "data" / "train").glob("*_A.nii.gz")):
        a = nib.load(str(path)).get_fdata()
        b = nib.load(str(path).replace("_A.nii.gz", "_B.nii.gz")).get_fdata()
        head = _head(a)
        xs.append(_norm(gaussian_blur(a, 1.0))[head])
        ys.append((b / max(float(b[head].mean()), 1e-9))[head])
    x, y = np.concatenate(xs), np.concatenate(ys)
    edges = np.linspace(0, np.percentile(x, 99.5), bins + 1)
    idx = np.clip(np.digitize(x, edges) - 1, 0, bins - 1)
    centres = 0.5 * (edges[1:] + edges[:-1])
    counts = np.bincount(idx, minlength=bins)
    means = np.bincount(idx, y, minlength=bins) / np.maximum(counts, 1)
    keep = counts > 0
    table_x, table_y = centres[keep], means[keep]

    def fn(a):
        head = _head(a)
        return np.where(head, np.interp(_norm(gaussian_blur(a, 1.0)), table_x, table_y), 0.0)

    return _run(workspace, ids, fn)


HEURISTICS = {"negated_blur": negated_blur, "pair_table": pair_table}
