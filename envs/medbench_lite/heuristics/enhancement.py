"""Model-free restorers for the enhancement track: linear, rank and edge-preserving filters in HU.

What a reader who knows the literature could run without the provided model, each
written from scratch: Gaussian and median filters, the bilateral filter (Tomasi and
Manduchi, 1998), total-variation denoising (Chambolle's projection, 2004), non-local
means (Buades, Coll and Morel, 2005) with its filtering parameter tied to the measured
noise, and image-domain ring removal (the rings' radial profile estimated from the
image itself: the angular median per radius minus its running median over radius, as
in polar-coordinate ring correction, optionally per angular sector, about a searched
centre, or fitted as a radial profile times an angular gain) followed by total variation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite.heuristics._common import box_blur, gaussian_blur, save_like

__all__ = [
    "HEURISTICS",
    "bilateral",
    "gaussian",
    "median",
    "nonlocal_means",
    "ring_removal_tv",
    "separable_rings_tv",
    "total_variation",
]


def _run(workspace: Path, ids: Sequence[str], fn) -> dict[str, dict[str, str]]:
    import nibabel as nib

    ws = Path(workspace)
    rows = {}
    for cid in ids:
        img = nib.load(str(ws / "data" / "images" / f"{cid}.nii.gz"))
        rel = f"outputs/denoised/{cid}.nii.gz"
        save_like(img, fn(img.get_fdata()), ws / rel)
        rows[cid] = {"output_file": rel}
    return rows


def _median3(a: np.ndarray) -> np.ndarray:
    p = np.pad(a, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = a.shape[:2]
    stack = [p[i : i + h, j : j + w] for i in range(3) for j in range(3)]
    return np.median(np.stack(stack), axis=0)


def gaussian(workspace: Path, ids: Sequence[str], sigma_px: float = 1.0) -> dict:
    """Each slice smoothed with a Gaussian of ``sigma_px`` pixels, in HU."""
    return _run(workspace, ids, lambda hu: gaussian_blur(hu, sigma_px))


def median(workspace: Path, ids: Sequence[str]) -> dict:
    """Each slice through a 3 x 3 median filter, twice."""
    return _run(workspace, ids, lambda hu: _median3(_median3(hu)))


def _bilateral2d(img: np.ndarray, radius: int, sigma_px: float, sigma_hu: float) -> np.ndarray:
    """One bilateral pass over a 2D slice (HU in, HU out; edges repeated)."""
    padded = np.pad(img, radius, mode="edge")
    h, w = img.shape
    acc = np.zeros_like(img)
    norm = np.zeros_like(img)
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            nb = padded[radius + dy : radius + dy + h, radius + dx : radius + dx + w]
            wgt = np.exp(
                -(dy * dy + dx * dx) / (2 * sigma_px**2) - (nb - img) ** 2 / (2 * sigma_hu**2)
            )
            acc += wgt * nb
            norm += wgt
    return acc / norm


def bilateral(
    workspace: Path,
    ids: Sequence[str],
    radius: int = 3,
    sigma_px: float = 2.0,
    sigma_hu: float = 100.0,
    passes: int = 2,
) -> dict:
    """Each slice through ``passes`` bilateral passes (range kernel ``sigma_hu`` in HU)."""

    def run(hu: np.ndarray) -> np.ndarray:
        out = np.empty_like(hu)
        for k in range(hu.shape[-1]):
            img = hu[..., k].astype(np.float64)
            for _ in range(passes):
                img = _bilateral2d(img, radius, sigma_px, sigma_hu)
            out[..., k] = img
        return out

    return _run(workspace, ids, run)


def _tv2d(img: np.ndarray, weight_hu: float, iters: int = 80) -> np.ndarray:
    """``argmin_u |u - img|^2 / 2 + weight_hu * TV(u)`` on a 2D slice in HU (Chambolle 2004)."""

    def grad(u):
        gx, gy = np.zeros_like(u), np.zeros_like(u)
        gx[:, :-1] = u[:, 1:] - u[:, :-1]
        gy[:-1, :] = u[1:, :] - u[:-1, :]
        return gx, gy

    def div(px, py):  # minus the adjoint of grad
        dx, dy = np.zeros_like(px), np.zeros_like(py)
        dx[:, 0], dx[:, 1:-1], dx[:, -1] = px[:, 0], px[:, 1:-1] - px[:, :-2], -px[:, -2]
        dy[0], dy[1:-1], dy[-1] = py[0], py[1:-1] - py[:-2], -py[-2]
        return dx + dy

    px, py = np.zeros_like(img), np.zeros_like(img)
    for _ in range(iters):
        gx, gy = grad(div(px, py) - img / weight_hu)
        norm = 1.0 + 0.125 * np.hypot(gx, gy)
        px, py = (px + 0.125 * gx) / norm, (py + 0.125 * gy) / norm
    return img - weight_hu * div(px, py)


def _per_slice(fn):
    """Apply a 2D HU -> HU function to every slice of a stack (slices on the last axis)."""
    return lambda hu: np.stack(
        [fn(np.asarray(hu[..., k], dtype=np.float64)) for k in range(hu.shape[-1])], axis=-1
    )


def total_variation(workspace: Path, ids: Sequence[str], weight_hu: float = 40.0) -> dict:
    """Each slice through total-variation denoising with weight ``weight_hu`` (HU)."""
    return _run(workspace, ids, _per_slice(lambda img: _tv2d(img, weight_hu)))


def _noise_sigma(img: np.ndarray) -> float:
    """Robust noise std (HU): MAD of horizontal differences / sqrt 2, Gaussian-consistent."""
    d = np.diff(img, axis=1).ravel()
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def _nlm2d(img: np.ndarray, h: float, patch: int = 5, search: int = 11) -> np.ndarray:
    """Non-local means on a 2D slice: weights ``exp(-mean patch SSD / h^2)``."""
    pr, sr = patch // 2, search // 2
    pad = np.pad(img, sr + pr, mode="reflect")
    hgt, wid = img.shape
    core = pad[sr : sr + hgt + 2 * pr, sr : sr + wid + 2 * pr]
    acc = np.zeros_like(img)
    norm = np.zeros_like(img)
    for dy in range(-sr, sr + 1):
        for dx in range(-sr, sr + 1):
            moved = pad[sr + dy : sr + dy + hgt + 2 * pr, sr + dx : sr + dx + wid + 2 * pr]
            ssd = box_blur((core - moved) ** 2, patch)[pr : pr + hgt, pr : pr + wid]
            wgt = np.exp(-ssd / (h * h))
            acc += wgt * moved[pr : pr + hgt, pr : pr + wid]
            norm += wgt
    return acc / norm


def nonlocal_means(workspace: Path, ids: Sequence[str], h_factor: float = 1.0) -> dict:
    """Each slice through non-local means, ``h = h_factor`` x the slice's measured noise."""
    return _run(
        workspace, ids, _per_slice(lambda img: _nlm2d(img, h_factor * max(_noise_sigma(img), 1.0)))
    )


def _ring_profile(img: np.ndarray, bins: np.ndarray, baseline_px: float, median_base: bool):
    """Ring profile per radius bin: angular median of soft tissue minus its radial baseline."""
    soft = (img > -200) & (img < 300)
    n = int(bins.max()) + 1
    prof = np.full(n, np.nan)
    for i in range(n):
        sel = (bins == i) & soft
        if sel.sum() >= 6:
            prof[i] = np.median(img[sel])
    idx = np.arange(n)
    ok = np.isfinite(prof)
    if not ok.any():
        return np.zeros(n)
    prof = np.interp(idx, idx[ok], prof[ok])
    k = max(1, int(round(baseline_px / _RING_BIN_PX)))
    if median_base:  # running median over baseline_px of radius
        padded = np.pad(prof, k // 2, mode="edge")
        base = np.array([np.median(padded[i : i + 2 * (k // 2) + 1]) for i in range(n)])
    else:  # Gaussian of sigma baseline_px over radius
        taps = np.exp(-0.5 * (np.arange(-3 * k, 3 * k + 1) / k) ** 2)
        base = np.convolve(np.pad(prof, 3 * k, mode="edge"), taps / taps.sum(), mode="valid")
    return prof - base


_RING_BIN_PX = 0.5


def _ring_centre(hu: np.ndarray, reach_px: float = 12.0) -> tuple[float, float]:
    """Where the rings of a stack are centred: (row, column) offset from the image centre, px.

    The rings are circles about the scanner's isocentre, which need not be the image
    centre. For a candidate centre, the high-passed soft-tissue pixels away from edges
    (image minus a Gaussian blur of 2 px; gradient of the image blurred by 1.5 px below
    15 HU per pixel) are averaged per 0.5 px radius bin; the centre that such a
    radial function explains best (sum over bins of count x mean^2, over all slices)
    wins: a grid of 1.5 px steps within ``reach_px``, refined at 0.5 and 0.25 px.
    """
    hgt, wid = hu.shape[:2]
    rr, cc = np.mgrid[:hgt, :wid] + 0.5
    slices = []
    for k in range(hu.shape[-1]):
        img = np.asarray(hu[..., k], dtype=np.float64)
        # Soft tissue away from organ edges: edges are circles too, about the body's centre.
        gy, gx = np.gradient(gaussian_blur(img, 1.5))
        soft = (img > -200) & (img < 300) & (np.hypot(gy, gx) < 15.0)
        slices.append(((img - gaussian_blur(img, 2.0))[soft], soft))

    def explained(off):
        rad = np.hypot(rr - hgt / 2 - off[0], cc - wid / 2 - off[1])
        total = 0.0
        for hp, soft in slices:
            b = np.floor(rad[soft] / _RING_BIN_PX).astype(int)
            n = np.bincount(b)
            sums = np.bincount(b, weights=hp)
            total += float(np.sum(sums[n > 0] ** 2 / n[n > 0]))
        return total

    grid = np.arange(-reach_px, reach_px + 1e-9, 1.5)
    best = max(((a, b) for a in grid for b in grid if np.hypot(a, b) <= reach_px), key=explained)
    for step in (0.5, 0.25):
        near = (-2 * step, -step, 0.0, step, 2 * step)
        best = max(((best[0] + a, best[1] + b) for a in near for b in near), key=explained)
    return best


def _remove_rings(
    img: np.ndarray,
    baseline_px: float = 20.0,
    median_base: bool = True,
    sectors: int = 1,
    centre: tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    """Image-domain ring correction centred on the image centre (the usual isocentre).

    ``centre`` is the rings' offset from the image centre (pixels, :func:`_ring_centre`).
    Per radius bin (0.5 px) and angular sector, the median of the soft-tissue-range
    pixels (-200 to 300 HU); the ring profile is that minus its baseline over radius
    (a running median over ``baseline_px`` pixels, or a Gaussian of sigma
    ``baseline_px``: anatomy varies slowly with radius after the angular median, rings
    do not), subtracted from every pixel of the sector at that radius. Several
    sectors follow rings whose strength changes around the circle, at the cost of
    fewer pixels per estimate.
    """
    hgt, wid = img.shape
    rr, cc = np.mgrid[:hgt, :wid] + 0.5
    rr, cc = rr - hgt / 2 - centre[0], cc - wid / 2 - centre[1]
    bins = np.floor(np.hypot(rr, cc) / _RING_BIN_PX).astype(int)
    angle = np.arctan2(rr, cc)
    sector = np.floor((angle + np.pi) / (2 * np.pi) * sectors).astype(int) % sectors
    out = img.copy()
    for s in range(sectors):
        part = sector == s
        # Pixels of other sectors are set outside the soft-tissue range: not counted.
        prof = _ring_profile(np.where(part, img, 1e4), bins, baseline_px, median_base)
        out[part] -= prof[bins[part]]
    return out


def _separable_rings(
    img: np.ndarray,
    centre: tuple[float, float],
    baseline_px: float = 20.0,
    sectors: int = 32,
    harmonics: int = 12,
) -> np.ndarray:
    """Ring correction assuming the artifact is a radial profile times an angular gain.

    Polar cells (0.5 px of radius x ``sectors`` angles about ``centre``, the rings'
    offset from the image centre): the median of the soft-tissue pixels (-200 to 300 HU)
    per cell, minus each sector's running median over ``baseline_px`` of radius, is
    fitted by ``p(r) g(angle)`` (alternating least squares; ``g`` a Fourier series of
    ``harmonics`` terms, so the rings may fade and change sign around the circle), and
    that product is subtracted from every pixel.
    """
    hgt, wid = img.shape
    rr, cc = np.mgrid[:hgt, :wid] + 0.5
    rr, cc = rr - hgt / 2 - centre[0], cc - wid / 2 - centre[1]
    rbin = np.floor(np.hypot(rr, cc) / _RING_BIN_PX).astype(int)
    angle = np.arctan2(rr, cc)
    abin = np.floor((angle + np.pi) / (2 * np.pi) * sectors).astype(int) % sectors
    soft = (img > -200) & (img < 300)
    n = int(rbin.max()) + 1
    k = max(1, int(round(baseline_px / _RING_BIN_PX))) // 2
    cells = np.full((n, sectors), np.nan)
    for a in range(sectors):
        sel = (abin == a) & soft
        col = np.full(n, np.nan)
        for i in np.unique(rbin[sel]):
            col[i] = np.median(img[sel & (rbin == i)])
        ok = np.isfinite(col)
        if ok.sum() < 10:
            continue
        idx = np.arange(n)
        padded = np.pad(np.interp(idx, idx[ok], col[ok]), k, mode="edge")
        base = np.array([np.median(padded[i : i + 2 * k + 1]) for i in range(n)])
        cells[:, a] = col - base
    seen = np.isfinite(cells)
    res = np.where(seen, cells, 0.0)

    def fourier(theta):
        waves = [f(j * theta) for j in range(1, harmonics + 1) for f in (np.cos, np.sin)]
        return np.stack([np.ones_like(theta), *waves], axis=-1)

    basis = fourier((np.arange(sectors) + 0.5) / sectors * 2 * np.pi - np.pi)
    coef = np.zeros(basis.shape[1])
    coef[0] = 1.0
    for _ in range(20):
        g = basis @ coef
        p = (res * g).sum(1) / np.maximum((seen * g * g).sum(1), 1e-9)
        design = (seen * p[:, None])[:, :, None] * basis[None]  # (r, sector, term)
        coef = np.linalg.lstsq(design[seen], res[seen], rcond=None)[0]
    g_pix = fourier(angle) @ coef
    p_pix = np.interp(np.hypot(rr, cc) / _RING_BIN_PX - 0.5, np.arange(n), p)
    return img - p_pix * g_pix


def separable_rings_tv(workspace: Path, ids: Sequence[str], weight_hu: float = 40.0) -> dict:
    """Each stack: rings' centre searched, separable ring fit removed per slice, then TV."""

    def run(hu: np.ndarray) -> np.ndarray:
        centre = _ring_centre(hu)
        return _per_slice(lambda img: _tv2d(_separable_rings(img, centre), weight_hu))(hu)

    return _run(workspace, ids, run)


def ring_removal_tv(
    workspace: Path,
    ids: Sequence[str],
    baseline_px: float = 20.0,
    median_base: bool = True,
    sectors: int = 1,
    weight_hu: float = 40.0,
    find_centre: bool = False,
) -> dict:
    """Each slice: image-domain ring removal (:func:`_remove_rings`), then total variation.

    With ``find_centre`` the rings' centre is searched per stack (:func:`_ring_centre`);
    otherwise it is the image centre.
    """

    def run(hu: np.ndarray) -> np.ndarray:
        centre = _ring_centre(hu) if find_centre else (0.0, 0.0)
        fix = lambda img: _remove_rings(img, baseline_px, median_base, sectors, centre)  # noqa: E731
        return _per_slice(lambda img: _tv2d(fix(img), weight_hu))(hu)

    return _run(workspace, ids, run)


HEURISTICS = {
    # The former model's window in HU units, a wider one, and a narrower range kernel.
    "bilateral_5x5": lambda ws, ids: bilateral(ws, ids, 2, 1.5),
    "bilateral_7x7": bilateral,
    "bilateral_7x7_40hu": lambda ws, ids: bilateral(ws, ids, 3, 2.0, 40.0),
    "gaussian_0.7": lambda ws, ids: gaussian(ws, ids, 0.7),
    "gaussian_1.0": lambda ws, ids: gaussian(ws, ids, 1.0),
    "gaussian_1.5": lambda ws, ids: gaussian(ws, ids, 1.5),
    "median_3x3_twice": median,
    # The TV weight and the NLM filtering parameter over the range that suits the noise.
    "tv_20": lambda ws, ids: total_variation(ws, ids, 20.0),
    "tv_40": total_variation,
    "tv_80": lambda ws, ids: total_variation(ws, ids, 80.0),
    # The measured noise (from pixel differences) underestimates the blob-like noise, so
    # the NLM grid reaches well above 1.
    "nlm_1.5": lambda ws, ids: nonlocal_means(ws, ids, 1.5),
    "nlm_3": lambda ws, ids: nonlocal_means(ws, ids, 3.0),
    "nlm_4.5": lambda ws, ids: nonlocal_means(ws, ids, 4.5),
    "nlm_6": lambda ws, ids: nonlocal_means(ws, ids, 6.0),
    "nlm_9": lambda ws, ids: nonlocal_means(ws, ids, 9.0),
    # Ring removal: the textbook running-median baseline, a Gaussian baseline (the best
    # width of a small grid), and the same per quadrant (rings that fade around the circle).
    "rings_median20_tv": ring_removal_tv,
    "rings_gauss10_tv": lambda ws, ids: ring_removal_tv(ws, ids, 10.0, False),
    "rings_gauss10_quadrants_tv": lambda ws, ids: ring_removal_tv(ws, ids, 10.0, False, 4),
    # The same with the rings' centre searched per stack (it is the isocentre, not
    # necessarily the image centre).
    "rings_centred_median20_tv": lambda ws, ids: ring_removal_tv(ws, ids, find_centre=True),
    "rings_centred_gauss10_tv": lambda ws, ids: ring_removal_tv(
        ws, ids, 10.0, False, find_centre=True
    ),
    "rings_centred_gauss10_quadrants_tv": lambda ws, ids: ring_removal_tv(
        ws, ids, 10.0, False, 4, find_centre=True
    ),
    "rings_centred_median20_quadrants_tv": lambda ws, ids: ring_removal_tv(
        ws, ids, 20.0, True, 4, find_centre=True
    ),
    "rings_centred_median20_octants_tv": lambda ws, ids: ring_removal_tv(
        ws, ids, 20.0, True, 8, find_centre=True
    ),
    # Rings as a radial profile times a gain around the circle, fitted jointly.
    "rings_separable_tv": separable_rings_tv,
}
