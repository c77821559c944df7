"""Low-dose CT restoration: calibrated radial artifact removal, then total-variation denoising.

MedBench-Lite model ``ldct-calibrated``; numpy only. Every parameter is in normalized
units (HU window mapped to [0, 1]); see MODEL_CARD.md.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "load",
    "to_unit",
    "from_unit",
    "denoise",
    "find_isocentre",
    "remove_artifact",
    "tv_denoise",
]


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


def _radial(shape: tuple[int, int], centre: tuple[float, float]):
    """Per pixel: offsets (rows, columns) from ``centre`` (continuous pixel coordinates)."""
    h, w = shape
    rr, cc = np.mgrid[:h, :w] + 0.5
    return rr - centre[0], cc - centre[1]


def _calibrated(weights: dict, row: int, radius: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """Detector ``row``'s calibrated artifact at gain 1, normalized units, per pixel.

    The mean profile ``artifact_profile`` at ``radius`` (image half-widths) plus the
    rings' segment pattern: for each k of ``segment_harmonics``, the radial factors
    ``segment_cos`` and ``segment_sin`` times ``cos`` and ``sin`` of k ``angle`` (rad).
    """
    grid = weights["artifact_radius"]
    out = np.interp(radius, grid, weights["artifact_profile"][row])
    for j, k in enumerate(weights["segment_harmonics"]):
        out = out + np.interp(radius, grid, weights["segment_cos"][row, j]) * np.cos(k * angle)
        out = out + np.interp(radius, grid, weights["segment_sin"][row, j]) * np.sin(k * angle)
    return out


def _artifact(
    shape: tuple[int, int], row: int, weights: dict, offset: tuple[float, float] = (0.0, 0.0)
) -> np.ndarray:
    """Detector ``row``'s calibrated artifact on an image of ``shape`` (gain 1).

    Args:
        shape: ``(H, W)`` of the slice.
        row: detector row (index into ``artifact_profile``).
        weights: the dict returned by :func:`load`.
        offset: the isocentre's (row, column) offset from the image centre, pixels.

    Returns:
        Array ``(1 + 2 * sweep_harmonics, H, W)``: the artifact (:func:`_calibrated`), then it times
        the cosine and the sine of k times the pixel's angle about the isocentre, for
        k = 1 .. ``sweep_harmonics`` (the basis of a gain that drifts around the circle).
    """
    h, w = shape
    rr, cc = _radial(shape, (h / 2 + offset[0], w / 2 + offset[1]))
    # The scan field of view fills the image: radius in units of the half-width.
    radius = np.hypot(rr, cc) / (min(h, w) / 2)
    angle = np.arctan2(rr, cc)
    art = _calibrated(weights, row, radius, angle)
    harmonics = range(1, int(weights["sweep_harmonics"]) + 1)
    return np.stack([art] + [art * f(k * angle) for k in harmonics for f in (np.cos, np.sin)])


def _fit_inputs(img: np.ndarray, weights: dict) -> tuple[np.ndarray, np.ndarray]:
    """The high-passed image and the mask of pixels away from edges the fits use."""
    gy, gx = np.gradient(_gaussian(img, 1.5))
    flat = np.hypot(gy, gx) < float(weights["edge_grad"])
    return img - _gaussian(img, float(weights["fit_highpass_px"])), flat


def find_isocentre(x: np.ndarray, weights: dict) -> tuple[float, float]:
    """The isocentre's (row, column) offset from the image centre, pixels, for a stack.

    Patients, not the isocentre, are centred in the reconstructed field, so the rings'
    centre moves from case to case (the same for every slice of a stack). The offset
    maximizes the least-squares fit of the calibrated profile (mean gain only) summed
    over the slices: over whole pixels up to ``max_offset`` image half-widths by FFT
    cross-correlation, then refined on a quarter-pixel grid.

    Args:
        x: normalized stack ``(H, W, S)`` (or a 2D slice).
        weights: the dict returned by :func:`load`.
    """
    stack = x[..., None] if x.ndim == 2 else x
    h, w, n = stack.shape
    rows = len(weights["artifact_profile"])
    sigma = float(weights["fit_highpass_px"])
    limit = float(weights["max_offset"]) * min(h, w) / 2
    inputs = [_fit_inputs(stack[..., k], weights) for k in range(n)]
    # Canvas index q holds the profile at distance |q + 0.5 - (h, w)|: the isocentre at
    # (h, w). A pixel p of an image whose isocentre is at (h/2 + d) reads it at
    # q = p + (h - h/2 - d): the correlation lag e = (h - h/2 - d) gives the offset d.
    big = (2 * h, 2 * w)
    total = np.zeros(big)
    for k in range(n):
        # The profile on the canvas, radius still in units of the image's half-width.
        rr, cc = _radial(big, (h, w))
        prof = _calibrated(
            weights, k % rows, np.hypot(rr, cc) / (min(h, w) / 2), np.arctan2(rr, cc)
        )
        hp_t = prof - _gaussian(prof, sigma)
        hx, flat = inputs[k]
        a = np.zeros(big)
        a[:h, :w] = np.where(flat, hx, 0.0)
        m = np.zeros(big)
        m[:h, :w] = flat
        fa, fm = np.conj(np.fft.fft2(a)), np.conj(np.fft.fft2(m))
        corr = np.real(np.fft.ifft2(fa * np.fft.fft2(hp_t)))
        norm = np.real(np.fft.ifft2(fm * np.fft.fft2(hp_t * hp_t)))
        total += corr**2 / np.maximum(norm, 1e-12)
    e_r, e_c = np.mgrid[: big[0], : big[1]]
    d_r, d_c = h - h / 2 - e_r, w - w / 2 - e_c
    total[np.hypot(d_r, d_c) > limit] = -np.inf
    i = np.unravel_index(int(np.argmax(total)), total.shape)
    best = (float(d_r[i]), float(d_c[i]))

    def score(off):
        val = 0.0
        for k in range(n):
            hx, flat = inputs[k]
            art = _artifact((h, w), k % rows, weights, off)[0]
            ah = (art - _gaussian(art, sigma))[flat]
            den = float(np.sum(ah * ah))
            val += float(np.sum(ah * hx[flat])) ** 2 / den if den > 0 else 0.0
        return val

    steps = np.arange(-0.5, 0.51, 0.25)
    return max(((best[0] + a, best[1] + b) for a in steps for b in steps), key=score)


def remove_artifact(
    img: np.ndarray, row: int, weights: dict, offset: tuple[float, float] = (0.0, 0.0)
) -> tuple[np.ndarray, float]:
    """Subtract detector ``row``'s calibrated artifact, scaled by its fitted drift gain.

    The gain ``g0 + sum_k (a_k cos(k angle) + b_k sin(k angle))`` (the channel gains
    drift during the rotation, so rings fade and return around the circle) is the
    least-squares fit of the high-passed basis of :func:`_artifact` to the high-passed
    image (each minus a Gaussian blur of ``fit_highpass_px`` pixels) over pixels away
    from edges (gradient of the lightly blurred image below ``edge_grad`` per pixel):
    anatomy edges would otherwise bias it. ``g0`` is clipped to ``gain_range`` and each
    harmonic's swing ``hypot(a_k, b_k) / g0`` to ``max_sweep``. ``fit_passes`` passes:
    each takes the edge mask of the image minus the previous pass's artifact.

    Args:
        img: normalized 2D slice.
        row: its detector row.
        weights: the dict returned by :func:`load`.
        offset: the isocentre's offset from the image centre (:func:`find_isocentre`).

    Returns:
        The corrected 2D image (normalized units) and the mean gain ``g0`` used.
    """
    basis = _artifact(img.shape, row, weights, offset)
    sigma = float(weights["fit_highpass_px"])
    hp_basis = np.stack([b - _gaussian(b, sigma) for b in basis])
    x_hp = img - _gaussian(img, sigma)
    lo, hi = (float(v) for v in weights["gain_range"])
    fitted = np.zeros_like(img)
    g0 = 0.0
    for _ in range(int(weights["fit_passes"])):
        # Strong rings look like edges too: the mask is taken after removing the last fit.
        _, flat = _fit_inputs(img - fitted, weights)
        if flat.sum() < 3 * len(basis):
            return img.copy(), 0.0
        g, *_ = np.linalg.lstsq(hp_basis[:, flat].T, x_hp[flat], rcond=None)
        g0 = float(np.clip(g[0], lo, hi))
        swing = g[1:].reshape(-1, 2)
        size = np.hypot(swing[:, 0], swing[:, 1])[:, None]
        limit = float(weights["max_sweep"]) * g0
        swing = swing * np.minimum(1.0, limit / np.maximum(size, 1e-12))
        fitted = np.tensordot(np.concatenate([[g0], swing.ravel()]), basis, axes=1)
    return img - fitted, g0


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

    The isocentre is located once for the stack (:func:`find_isocentre`); each slice k
    (detector row k; a 2D image is row 0) then loses its calibrated radial artifact
    (:func:`remove_artifact`) and its noise (:func:`tv_denoise`).

    Args:
        x: intensities from :func:`to_unit` (every parameter assumes that scale).
        weights: the dict returned by :func:`load`.

    Returns:
        The restored array, same shape, still normalized (use :func:`from_unit`).
    """
    arr = np.asarray(x, dtype=np.float64)
    stack = arr[..., None] if arr.ndim == 2 else arr
    rows = len(weights["artifact_profile"])
    offset = find_isocentre(stack, weights)
    out = np.empty_like(stack)
    for k in range(stack.shape[-1]):
        img, _ = remove_artifact(stack[..., k], k % rows, weights, offset)
        out[..., k] = tv_denoise(img, float(weights["tv_weight"]), int(weights["tv_iters"]))
    return out[..., 0] if arr.ndim == 2 else out
