"""Model-free image tools the 2D heuristics share: reading, blob finding, texture angle.

Everything here reads only public files and uses numpy (plus pydicom and Pillow to
decode), never the task's model: no weights, no matched filter. Two generic filters,
the box mean and the component labels, are imported from the detection model's file,
which holds them anyway. The tools are as good as a careful engineer without
the model would write them: traps (rescale, MONOCHROME1) are handled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Imported from the model file, not the other way round: a model file is shipped alone
# as model/infer_lib.py and may import nothing but numpy.
from bat_gym.envs.medbench_lite.models.detection import box_mean, label_components

__all__ = ["read_image", "blobs", "texture_angle", "angle_clusters"]


def read_image(path: Path) -> np.ndarray:
    """A PNG (/255) or DICOM (modality values / 4095, MONOCHROME1 inverted) as floats."""
    if path.suffix == ".png":
        from PIL import Image

        return np.asarray(Image.open(path), dtype=np.float64) / 255.0
    import pydicom
    from pydicom.pixels import apply_modality_lut

    ds = pydicom.dcmread(path)
    v = apply_modality_lut(ds.pixel_array, ds).astype(np.float64) / 4095.0
    return 1.0 - v if ds.PhotometricInterpretation == "MONOCHROME1" else v


def blobs(x: np.ndarray, threshold: float, min_area: int = 12, max_area: int = 400) -> list[dict]:
    """Bright compact blobs: smoothed local contrast over ``threshold``, then components.

    Returns ``{"row", "col", "radius", "contrast", "box_rc"}`` per blob, brightest first;
    ``box_rc`` is ``[row0, col0, row1, col1]`` in pixel edges.
    """
    resp = box_mean(x, 5) - box_mean(x, 21)
    lab = label_components(resp > threshold)
    out = []
    for k in np.unique(lab[lab > 0]):
        rows, cols = np.nonzero(lab == k)
        if not min_area <= rows.size <= max_area:
            continue
        out.append(
            {
                "row": float(rows.mean()) + 0.5,
                "col": float(cols.mean()) + 0.5,
                "radius": float(np.sqrt(rows.size / np.pi)),
                "contrast": float(resp[rows, cols].max()),
                "box_rc": [
                    float(rows.min()) - 0.5,
                    float(cols.min()) - 0.5,
                    float(rows.max()) + 1.5,
                    float(cols.max()) + 1.5,
                ],
            }
        )
    return sorted(out, key=lambda b: -b["contrast"])


def texture_angle(x: np.ndarray, row: float, col: float, half: int = 6) -> float:
    """The dominant stripe orientation (radians in ``[0, pi)``) of a patch, by its spectrum.

    The patch is windowed, its mean removed, and the angle of the strongest
    non-DC spatial frequency (below the Nyquist band) is returned.
    """
    r0, c0 = int(round(row)), int(round(col))
    p = x[max(0, r0 - half) : r0 + half + 1, max(0, c0 - half) : c0 + half + 1]
    if p.shape[0] < 5 or p.shape[1] < 5:
        return 0.0
    p = (p - p.mean()) * np.outer(np.hanning(p.shape[0]), np.hanning(p.shape[1]))
    n = 32
    f = np.abs(np.fft.fft2(p, s=(n, n))) ** 2
    ky = np.fft.fftfreq(n)[:, None]
    kx = np.fft.fftfreq(n)[None, :]
    k = np.hypot(ky, kx)
    f[(k < 0.12) | (k > 0.4)] = 0.0  # skip the blob's envelope and the noise band
    i = np.unravel_index(int(np.argmax(f)), f.shape)
    return float(np.arctan2(ky[i[0], 0], kx[0, i[1]]) % np.pi)


def angle_clusters(angles: np.ndarray, k: int = 6) -> np.ndarray:
    """Assign angles (mod pi) to ``k`` equal sectors, with the offset that fits them best."""
    a = np.asarray(angles, dtype=np.float64) % np.pi
    step = np.pi / k
    best, best_off = np.inf, 0.0
    for off in np.linspace(0, step, 16, endpoint=False):
        d = (a - off) % step
        cost = float(np.sum(np.minimum(d, step - d) ** 2))
        if cost < best:
            best, best_off = cost, off
    return np.rint((a - best_off) / step).astype(int) % k
