"""Task metrics of MedBench-Lite as pure numpy functions.

Every function takes plain arrays or Python values and returns a float in ``[0, 1]``
(higher is better), so a track's scorer only has to read files and call one of these.
Conventions where a metric is undefined are stated per function; they never raise
on empty inputs, because an empty prediction is a legitimate (if poor) submission.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "dice",
    "balanced_accuracy",
    "box_iou",
    "average_precision",
    "RECALL_POINTS",
    "ssim_map",
    "box_filter",
    "interior",
    "ssim",
    "normalized_mae",
    "normalize_answer",
    "exact_match",
    "finding_f1",
]


def dice(pred: np.ndarray, truth: np.ndarray, empty: float = 0.0) -> float:
    """Dice overlap ``2 |P & T| / (|P| + |T|)`` of two boolean masks of the same shape.

    It equals the F1 score of the flattened masks (scikit-learn's ``f1_score`` with
    ``zero_division=empty``). When both masks are empty the ratio is undefined and
    ``empty`` is returned: 0.0 by default, so an empty prediction never earns credit
    by itself; a scorer that wants a different convention (or none: leaving such a
    case out) says so where it calls this.

    Args:
        pred: predicted mask, any shape; non-zero is foreground.
        truth: true mask, the same shape.
        empty: the value when both masks are empty.

    Raises:
        ValueError: the shapes differ.
    """
    p = np.asarray(pred, dtype=bool)
    t = np.asarray(truth, dtype=bool)
    if p.shape != t.shape:
        raise ValueError(f"shapes differ: {p.shape} vs {t.shape}")
    total = int(p.sum()) + int(t.sum())
    if total == 0:
        return float(empty)
    return 2.0 * int(np.logical_and(p, t).sum()) / total


def balanced_accuracy(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """Mean recall over the classes present in ``y_true``: ``mean_c P(pred = c | true = c)``.

    The same as :func:`sklearn.metrics.balanced_accuracy_score` (without ``adjusted``):
    a predicted class absent from ``y_true`` only costs recall, it adds no class.
    Labels are compared by value, so any value works: a prediction that is no class of
    ``y_true`` (``-1``, ``nan``, ``inf``) is simply wrong, never an error. Unlike plain
    accuracy it is not inflated by always predicting the majority class. Returns 0.0
    for empty input.

    Raises:
        ValueError: the two sequences differ in length.
    """
    t, p = list(y_true), list(y_pred)
    if len(t) != len(p):
        raise ValueError(f"lengths differ: {len(t)} vs {len(p)}")
    if not t:
        return 0.0
    recalls = []
    for c in sorted(set(t), key=repr):
        idx = [i for i, v in enumerate(t) if v == c]
        recalls.append(sum(1 for i in idx if p[i] == c) / len(idx))
    return float(np.mean(recalls))


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``[x0, y0, x1, y1]`` boxes (x1 > x0, y1 > y0).

    Areas are continuous (``(x1 - x0) * (y1 - y0)``, no +1 pixel convention, as in
    COCO). A degenerate or non-finite box has IoU 0 with everything.
    """
    if not all(np.isfinite(v) for v in (*a[:4], *b[:4])):
        return 0.0
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    iou = inter / union if union > 0 else 0.0
    return float(iou) if np.isfinite(iou) else 0.0


RECALL_POINTS = np.linspace(0.0, 1.0, 101)
"""The 101 recall thresholds of COCO's interpolated AP."""


def average_precision(
    predictions: Iterable[tuple[str, Sequence[float], float]],
    truths: Mapping[str, Sequence[Sequence[float]]],
    iou_threshold: float = 0.5,
) -> float:
    """Single-class average precision at one IoU threshold, COCO style (AP@0.5 with 0.5).

    Args:
        predictions: ``(image_id, [x0, y0, x1, y1], score)`` for every predicted box.
        truths: ground-truth boxes per image id (images without lesions map to ``[]``).
        iou_threshold: the IoU a prediction needs to match an unmatched true box.

    What is computed, step by step (as ``pycocotools.COCOeval`` for one category, one
    IoU threshold, area range "all", no crowd boxes, at most 100 boxes per image):

    1. A prediction with a non-finite coordinate or score is dropped (as if never
       submitted); so is one on an image id not in ``truths``.
    2. Ranking: predictions are sorted by score, highest first; **ties** are broken by
       image id, then by the box ``(x0, y0, x1, y1)``, all ascending, so the result
       never depends on the order of submission.
    3. Matching: in that order, each prediction takes the still unmatched true box of
       its image with the highest IoU, if that IoU is at least ``iou_threshold``
       (between equal IoUs the last true box in ``truths`` order); it is then a true
       positive, else a false positive. Each true box matches at most once.
    4. Precision and recall after each prediction; precision is made monotone
       (the running maximum from the right), then read at the 101 recall points
       ``0, 0.01, ..., 1`` (the first prediction reaching each recall; 0 past the
       highest recall reached). AP is their mean.

    Deliberate deviations from COCO: with no true boxes at all, AP is 1.0 for no
    predictions and 0.0 otherwise (COCO leaves it undefined); there is no cap of 100
    boxes per image (COCO keeps each image's 100 best); ties are ranked as in step 2
    (COCO keeps submission order); a degenerate box (``x1 <= x0`` or ``y1 <= y0``) is
    a false positive (COCO ignores a negative-area box, which would let malformed
    output hide false positives). Duplicate boxes are false positives, so an output of many
    guesses earns only what its ranking earns.
    """
    preds = []
    for image_id, box, score in predictions:
        vals = [float(v) for v in box[:4]] + [float(score)]
        if len(vals) == 5 and all(np.isfinite(vals)) and image_id in truths:
            preds.append((str(image_id), vals[:4], vals[4]))
    preds.sort(key=lambda p: (-p[2], p[0], *p[1]))
    n_true = sum(len(v) for v in truths.values())
    if n_true == 0:
        return 1.0 if not preds else 0.0
    if not preds:
        return 0.0
    used = {k: np.zeros(len(v), dtype=bool) for k, v in truths.items()}
    tp = np.zeros(len(preds))
    for i, (image_id, box, _) in enumerate(preds):
        best, best_j = iou_threshold, -1
        for j, gt in enumerate(truths[image_id]):
            if used[image_id][j]:
                continue
            iou = box_iou(box, gt)
            if iou >= best:  # ">=": the last of equal IoUs, as pycocotools does
                best, best_j = iou, j
        if best_j >= 0:
            used[image_id][best_j] = True
            tp[i] = 1.0
    ctp = np.cumsum(tp)
    recall = ctp / n_true
    precision = ctp / np.arange(1, len(preds) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    at = np.searchsorted(recall, RECALL_POINTS, side="left")
    sampled = np.where(at < len(preds), envelope[np.minimum(at, len(preds) - 1)], 0.0)
    return float(sampled.mean())


def box_filter(a: np.ndarray, size: int, axes: tuple[int, ...] | range = (0, 1)) -> np.ndarray:
    """Mean over a ``size``-wide window along each of ``axes`` (edge padding), as float64.

    A running sum: the result has ``a``'s shape; ``size`` is in voxels along each axis.
    """
    r = size // 2
    out = np.asarray(a, dtype=np.float64)
    for axis in axes:
        pad = [(0, 0)] * out.ndim
        pad[axis] = (r + 1, r)
        c = np.cumsum(np.pad(out, pad, mode="edge"), axis=axis)
        n = out.shape[axis]
        out = (
            np.take(c, np.arange(size, size + n), axis=axis) - np.take(c, np.arange(n), axis=axis)
        ) / size
    return out


def _box_filter(a: np.ndarray, size: int) -> np.ndarray:
    """Mean over a ``size`` x ``size`` window on the first two axes (edge padding)."""
    return box_filter(a, size)


def ssim_map(x: np.ndarray, y: np.ndarray, data_range: float, win: int = 7) -> np.ndarray:
    """Local SSIM of two 2D images (uniform ``win`` x ``win`` window), per pixel.

    Per window: ``(2 mx my + C1)(2 cxy + C2) / ((mx^2 + my^2 + C1)(vx + vy + C2))`` with
    ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, ``L = data_range``, and sample
    (``n - 1``) variances and covariance: scikit-image's ``structural_similarity``
    with ``win_size=win``, ``gaussian_weights=False``, ``use_sample_covariance=True``.
    Windows that reach past the image edge repeat the edge pixels; :func:`ssim`
    leaves those pixels out, as scikit-image does. Arrays with a third axis are a
    stack of 2D slices along that axis (each slice compared on its own).

    Args:
        x: an image of shape ``(H, W)`` or a stack ``(H, W, S)``.
        y: the image to compare it with, the same shape.
        data_range: the intensity range ``L`` (same units as the images), positive.
        win: odd window side in pixels.

    Returns:
        The SSIM map, same shape as ``x``.

    Raises:
        ValueError: shapes differ, or ``data_range`` is not positive.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {y.shape}")
    if not data_range > 0:
        raise ValueError("data_range must be positive")
    c1 = (0.01 * data_range) ** 2
    c2 = (0.03 * data_range) ** 2
    # A non-finite pixel makes its windows nan, silently: the caller scores nan as 0.
    with np.errstate(invalid="ignore", over="ignore"):
        mx, my = _box_filter(x, win), _box_filter(y, win)
        # Sample (co)variances, as the reference implementations default to.
        k = win * win / (win * win - 1.0)
        vx = k * (_box_filter(x * x, win) - mx * mx)
        vy = k * (_box_filter(y * y, win) - my * my)
        cxy = k * (_box_filter(x * y, win) - mx * my)
        return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))


def interior(shape: tuple[int, ...], win: int = 7) -> np.ndarray:
    """Pixels whose ``win`` x ``win`` window lies inside the image (first two axes).

    These are the pixels scikit-image averages: it crops ``(win - 1) // 2`` pixels off
    every edge of the SSIM map, where the window would read padding.
    """
    keep = np.zeros(shape, dtype=bool)
    r = (win - 1) // 2
    keep[r : shape[0] - r, r : shape[1] - r] = True
    return keep


def ssim(
    x: np.ndarray,
    y: np.ndarray,
    data_range: float,
    mask: np.ndarray | None = None,
    win: int = 7,
) -> float:
    """Mean SSIM of two images (or slice stacks) over interior pixels, optionally masked.

    The mean of :func:`ssim_map` over the pixels of :func:`interior` (and of ``mask``
    when given): for a 2D image without a mask this is exactly scikit-image's
    ``structural_similarity(x, y, data_range=data_range, win_size=win)``; for a stack
    it is the mean of that over the slices. Non-finite inputs give ``nan`` (callers
    score that as 0).

    Returns:
        A value in ``[-1, 1]``; 1.0 means identical. No interior pixel selected: 0.0.
    """
    m = ssim_map(x, y, data_range, win)
    sel = interior(m.shape, win)
    if mask is not None:
        sel &= np.asarray(mask, dtype=bool)
    return float(m[sel].mean()) if sel.any() else 0.0


def normalized_mae(pred: np.ndarray, truth: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean absolute error over ``mask`` divided by the mean absolute true value there.

    Lower is better (0 is perfect); it is the one metric here that is an error, kept so
    because that is how synthesis papers report it. Returns ``inf`` for an empty or
    all-zero truth.
    """
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(truth, dtype=np.float64)
    sel = np.ones(t.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    denom = float(np.abs(t[sel]).mean()) if sel.any() else 0.0
    if denom == 0.0:
        return float("inf")
    return float(np.abs(p[sel] - t[sel]).mean()) / denom


_NUMBER_WORDS = {
    "zero": "0",
    "none": "0",
    "no nodules": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
}


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, spell numbers as digits.

    ``" Yes."`` -> ``"yes"``, ``"Two"`` -> ``"2"``, ``"the Left lung"`` -> ``"left lung"``.
    """
    t = str(text).strip().lower()
    t = re.sub(r"[^\w\s]", " ", t)
    t = re.sub(r"\b(a|an|the)\b", " ", t)
    t = re.sub(r"\s+", " ", t).strip()
    return _NUMBER_WORDS.get(t, t)


def exact_match(pred: str, truth: str) -> float:
    """1.0 when the normalized answers are equal (:func:`normalize_answer`), else 0.0.

    Any value is accepted and compared as text (``nan``, ``inf`` and ``1e400`` are
    just wrong answers). ``"none"`` and ``"no nodules"`` normalize to ``"0"``, so a
    VQA answer of ``0`` to "which lung holds the largest nodule" means "none".
    """
    return 1.0 if normalize_answer(pred) == normalize_answer(truth) else 0.0


def finding_f1(
    pred: Sequence[tuple[str, float]],
    truth: Sequence[tuple[str, float]],
    abs_tol_mm: float = 2.0,
    rel_tol: float = 0.15,
) -> tuple[float, float]:
    """F1 of reported findings and the accuracy of their sizes.

    Args:
        pred: ``(location, size_mm)`` per reported finding.
        truth: ``(location, size_mm)`` per true finding.
        abs_tol_mm: a size is right when within this many mm ...
        rel_tol: ... or within this fraction of the true size, whichever is larger.

    Findings match one to one only when their locations are equal. Within a location
    the pairs are formed closest first: over every (true, reported) pair, the one with
    the smallest size difference is matched, both leave, and so on (ties: smaller true
    size, then report order). The matched pairs are the true positives (``tp``).
    Returns ``(f1, size_accuracy)``: ``f1 = 2 tp / (len(pred) + len(truth))`` and the
    fraction of true findings matched with a size within tolerance. With no true and no
    reported findings both are 1.0 (a correct "no findings" report; the report track
    only calls this on a report that says so explicitly). A non-finite size is never
    within tolerance.
    """
    if not truth and not pred:
        return 1.0, 1.0
    tp = 0
    sized = 0
    for loc in {loc for loc, _ in truth}:
        t_sizes = sorted(float(s) for lo, s in truth if lo == loc)
        p_sizes = [float(s) for lo, s in pred if lo == loc]
        pairs = sorted(
            (abs(ps - ts) if np.isfinite(ps) else float("inf"), i, j)
            for i, ts in enumerate(t_sizes)
            for j, ps in enumerate(p_sizes)
        )
        used_t: set[int] = set()
        used_p: set[int] = set()
        for diff, i, j in pairs:
            if i in used_t or j in used_p:
                continue
            used_t.add(i)
            used_p.add(j)
            tp += 1
            if diff <= max(abs_tol_mm, rel_tol * t_sizes[i]):
                sized += 1
    f1 = 2 * tp / (len(pred) + len(truth))
    return float(f1), float(sized / len(truth)) if truth else 1.0
