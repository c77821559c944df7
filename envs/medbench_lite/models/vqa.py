"""Rule-based visual question answering on axial chest CT slices (lung window PNGs).

MedBench-Lite model ``chest-vqa-matched``; numpy only. It proposes bright blobs
enclosed by lung, keeps those whose internal texture matches the nodules it was trained
on (the matched filter ``weights["kernel"]``; vessels seen end-on look alike in size and
brightness but not in texture) and answers templated questions; see MODEL_CARD.md for
the display convention its side answers assume.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "response", "find_nodules", "answer"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _label(mask: np.ndarray) -> np.ndarray:
    """4-connected component labels (0 = background) by max-label propagation."""
    lab = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:
        prev = lab
        g = lab.copy()
        g[1:] = np.maximum(g[1:], lab[:-1])
        g[:-1] = np.maximum(g[:-1], lab[1:])
        g[:, 1:] = np.maximum(g[:, 1:], lab[:, :-1])
        g[:, :-1] = np.maximum(g[:, :-1], lab[:, 1:])
        lab = np.where(mask, g, 0)
        if np.array_equal(lab, prev):
            return lab


def _ahead(mask: np.ndarray, axis: int, sign: int, reach: int) -> np.ndarray:
    hit = np.zeros_like(mask)
    n = mask.shape[axis]
    for k in range(1, min(reach, n - 1) + 1):
        src = [slice(None), slice(None)]
        dst = [slice(None), slice(None)]
        src[axis], dst[axis] = (
            (slice(k, None), slice(0, n - k)) if sign > 0 else (slice(0, n - k), slice(k, None))
        )
        hit[tuple(dst)] |= mask[tuple(src)]
    return hit


def _smooth(x: np.ndarray) -> np.ndarray:
    """3 x 3 mean (edges repeated)."""
    p = np.pad(x, 1, mode="edge")
    h, w = x.shape
    return sum(p[i : i + h, j : j + w] for i in range(3) for j in range(3)) / 9.0


def response(x: np.ndarray, weights: dict) -> np.ndarray:
    """Matched-filter response per pixel of a [0, 1] image (edges reflected)."""
    k = np.asarray(weights["kernel"], dtype=np.float64)
    r = k.shape[0] // 2
    xp = np.pad(np.asarray(x, dtype=np.float64), r, mode="reflect")
    spec = np.fft.rfft2(xp) * np.conj(np.fft.rfft2(k, s=xp.shape))
    return np.fft.irfft2(spec, s=xp.shape)[: x.shape[0], : x.shape[1]]


def find_nodules(image: np.ndarray, weights: dict) -> list[dict]:
    """Nodules in a lung-window slice (float in [0, 1]).

    Bright blobs enclosed by lung are proposed; a blob is a nodule when the matched
    filter's strongest response inside it reaches ``weights["bias"]``.

    Returns:
        ``{"row", "col", "diameter_px", "score"}`` per nodule (centroid in image pixels,
        diameter from the blob's area, score the matched-filter peak).
    """
    raw = np.asarray(image, dtype=np.float64)
    x = _smooth(_smooth(raw))
    dark = x < float(weights["lung_below"])
    # Air outside the body is dark too; it is the dark region touching the border.
    lab = _label(dark)
    border = np.unique(np.concatenate([lab[0], lab[-1], lab[:, 0], lab[:, -1]]))
    lung = dark & ~np.isin(lab, border)
    bright = x > float(weights["tissue_above"])
    reach = int(weights["reach_px"])
    enclosed = bright.copy()
    for axis in (0, 1):
        for sign in (1, -1):
            enclosed &= _ahead(lung, axis, sign, reach)
    lab = _label(enclosed)
    resp = response(raw, weights)
    out = []
    for k in np.unique(lab[lab > 0]):
        rows, cols = np.nonzero(lab == k)
        if not int(weights["min_area"]) <= rows.size <= int(weights["max_area"]):
            continue
        peak = float(resp[rows, cols].max())
        if peak < float(weights["bias"]):
            continue
        out.append(
            {
                "row": round(float(rows.mean()), 2),
                "col": round(float(cols.mean()), 2),
                "diameter_px": round(float(2 * np.sqrt(rows.size / np.pi)), 2),
                "score": round(peak, 4),
            }
        )
    return out


def _side(col: float, width: int, convention: str) -> str:
    image_left = col < width / 2
    if convention == "radiological":  # the patient's right is shown on the image left
        return "right" if image_left else "left"
    return "left" if image_left else "right"


def answer(question: str, nodules: list[dict], width: int, convention: str = "neurological") -> str:
    """Answer one templated question from :func:`find_nodules` output.

    Args:
        question: the question text.
        nodules: the nodules found in the image.
        width: the image width in pixels.
        convention: how the image is displayed: ``"neurological"`` (default: the
            patient's left on the image left) or ``"radiological"`` (the patient's
            right on the image left). Side answers are given in patient terms.
    """
    q = question.lower()
    if "how many" in q and ("left lung" in q or "right lung" in q):
        side = "left" if "left lung" in q else "right"
        return str(sum(_side(n["col"], width, convention) == side for n in nodules))
    if "how many" in q:
        return str(len(nodules))
    if q.startswith("is there"):
        return "yes" if nodules else "no"
    if "largest" in q:
        if not nodules:
            return "none"
        big = max(nodules, key=lambda n: n["diameter_px"])
        return _side(big["col"], width, convention)
    if "which lung" in q:
        return _side(nodules[0]["col"], width, convention) if nodules else "none"
    return "unknown"
