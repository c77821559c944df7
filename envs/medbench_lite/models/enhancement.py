"""Low-dose CT restoration: calibrated radial artifact removal, then total-variation denoising.

MedBench-Lite model ``ldct-calibrated``; numpy only. Every parameter is in normalized
units (HU window mapped to [0, 1]); see MODEL_CARD.md.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load", "to_unit", "from_unit", "denoise", "remove_artifact", "tv_denoise"]


def load(path: str) -> dict[str, np.ndarray]:
    """Read the model parameters from ``weights.npz``."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def to_unit(hu: np.ndarray, weights: dict) -> np.ndarray:
    """Hounsfield units -> the model's normalized intensity (window -> [0, 1])."""
    lo, hi = (float(v) for v in weights["hu_window"])
    return (np.asarray(hu, dtype=np.float64) - lo) / (hi - lo)


def from_unit(x: np.ndarray, weights: dict) -> np.ndarray:
    """The model's normalized intensity -> Hounsfield units."""
    lo, hi = (float(v) for v in weights["hu_window"])
    return np.asarray(x, dtype=np.float64) * (hi - lo) + lo


def _gaussian(img: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of a 2D image (kernel to 3 sigma, edges repeated)."""
    r = max(1, int(np.ceil(3 * sigma)))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    out = img
    for axis in (0, 1):
        pad = [(0, 0), (0, 0)]
        pad[axis] = (r, r)
        p = np.pad(out, pad, mode="edge")
        n = img.shape[axis]
        out = sum(w * np.take(p, np.arange(i, i + n), axis=axis) for i, w in enumerate(k))
    return out


def _artifact(shape: tuple[int, int], row: int, weights: dict) -> np.ndarray:
    """Detector ``row``'s calibrated artifact on an image of ``shape`` (gain 1).

    Returns:
        Array ``(3, H, W)``: the profile, and the profile times the cosine and the sine
        of the pixel's angle about the centre (the basis of a gain that drifts once
        around the circle).
    """
    h, w = shape
    rr, cc = np.mgrid[:h, :w] + 0.5 - np.array([h / 2, w / 2])[:, None, None]
    # The scan field of view fills the image: radius in units of the half-width.
    radius = np.hypot(rr, cc) / (min(h, w) / 2)
    art = np.interp(radius, weights["artifact_radius"], weights["artifact_profile"][row])
    angle = np.arctan2(rr, cc)
    return np.stack(
        [art]
        + [art * f(k * angle) for k in range(1, int(weights["sweep_harmonics"]) + 1) for f in (np.cos, np.sin)]
    )


def remove_artifact(img: np.ndarray, row: int, weights: dict) -> tuple[np.ndarray, float]:
    """Subtract detector ``row``'s calibrated artifact, scaled by its fitted drift gain.

    The gain ``g0 + g1 cos(angle) + g2 sin(angle)`` (the channel gains drift during the
    rotation, so the rings are brighter on one side) is the least-squares fit of the
    high-passed basis of :func:`_artifact` to the high-passed image (each minus a
    Gaussian blur of ``fit_highpass_px`` pixels) over pixels away from edges (gradient
    of the lightly blurred image below ``edge_grad`` per pixel): anatomy edges would
    otherwise bias it. ``g0`` is clipped to ``gain_range`` and the swing
    ``hypot(g1, g2) / g0`` to ``max_sweep``.

    Returns:
        The corrected 2D image (normalized units) and the mean gain ``g0`` used.
    """
    basis = _artifact(img.shape, row, weights)
    sigma = float(weights["fit_highpass_px"])
    gy, gx = np.gradient(_gaussian(img, 1.5))
    flat = np.hypot(gy, gx) < float(weights["edge_grad"])
    if flat.sum() < 3 * len(basis):
        return img.copy(), 0.0
    a_hp = np.stack([(b - _gaussian(b, sigma))[flat] for b in basis], axis=1)
    x_hp = (img - _gaussian(img, sigma))[flat]
    g, *_ = np.linalg.lstsq(a_hp, x_hp, rcond=None)
    lo, hi = (float(v) for v in weights["gain_range"])
    g0 = float(np.clip(g[0], lo, hi))
    swing = g[1:].reshape(-1, 2)
    size = np.hypot(swing[:, 0], swing[:, 1])[:, None]
    limit = float(weights["max_sweep"]) * g0
    swing = swing * np.minimum(1.0, limit / np.maximum(size, 1e-12))
    gains = np.concatenate([[g0], swing.ravel()])
    return img - np.tensordot(gains, basis, axes=1), g0


def _grad(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    gx = np.zeros_like(u)
    gy = np.zeros_like(u)
    gx[:, :-1] = u[:, 1:] - u[:, :-1]
    gy[:-1, :] = u[1:, :] - u[:-1, :]
    return gx, gy


def _div(px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Minus the adjoint of :func:`_grad`."""
    dx = np.zeros_like(px)
    dy = np.zeros_like(py)
    dx[:, 0] = px[:, 0]
    dx[:, 1:-1] = px[:, 1:-1] - px[:, :-2]
    dx[:, -1] = -px[:, -2]
    dy[0, :] = py[0, :]
    dy[1:-1, :] = py[1:-1, :] - py[:-2, :]
    dy[-1, :] = -py[-2, :]
    return dx + dy


def tv_denoise(img: np.ndarray, weight: float, iters: int) -> np.ndarray:
    """``argmin_u |u - img|^2 / 2 + weight * TV(u)`` by Chambolle's projection (2004)."""
    px = np.zeros_like(img)
    py = np.zeros_like(img)
    tau = 0.125
    for _ in range(iters):
        gx, gy = _grad(_div(px, py) - img / weight)
        norm = 1.0 + tau * np.hypot(gx, gy)
        px = (px + tau * gx) / norm
        py = (py + tau * gy) / norm
    return img - weight * _div(px, py)


def denoise(x: np.ndarray, weights: dict) -> np.ndarray:
    """Restore a normalized image (2D) or slice stack (slices along the last axis).

    Each slice k (detector row k; a 2D image is row 0) loses its calibrated radial
    artifact (:func:`remove_artifact`), then its noise (:func:`tv_denoise`).

    Args:
        x: intensities from :func:`to_unit` (every parameter assumes that scale).
        weights: the dict returned by :func:`load`.

    Returns:
        The restored array, same shape, still normalized (use :func:`from_unit`).
    """
    arr = np.asarray(x, dtype=np.float64)
    stack = arr[..., None] if arr.ndim == 2 else arr
    rows = len(weights["artifact_profile"])
    out = np.empty_like(stack)
    for k in range(stack.shape[-1]):
        img, _ = remove_artifact(stack[..., k], k % rows, weights)
        out[..., k] = tv_denoise(img, float(weights["tv_weight"]), int(weights["tv_iters"]))
    return out[..., 0] if arr.ndim == 2 else out
