"""Enhancement track: restoring low-dose CT slices from one scanner (NIfTI).

Each case is a short stack of abdominal CT slices (one slice per detector row) from a
low-dose scan, stored as uint16 with ``scl_inter = -1024`` (nibabel's ``get_fdata``
returns HU). Two degradations are on every slice:

* quantum noise with the NPS of a filtered back-projection (ramp x Hann apodization
  up to ``_KERNEL_CUTOFF`` cycles/px): blob-like, not white;
* the scanner's radial artifact: concentric rings (detector channels whose gain drifted
  since calibration) over broad radial shading bands, centred on the isocentre. Its
  radial profile per detector row is the scanner's calibration
  (:func:`_scanner_profile`, the model's weights ``artifact_profile``); the rings are
  segmented (detector modules drift unequally), each ring's amplitude along its arc
  following its own fixed harmonic of order 8-24 (weights ``segment_*``), which one
  image cannot reveal. In a case the isocentre sits up to ``_ISO_OFFSET_MM`` from the
  image centre (the patient, not the isocentre, is centred) and the profile is scaled
  per slice by a drift gain (``_GAIN``) that also swings around the circle
  (``_HARMONICS`` harmonics of the angle, each swinging by the task's ``sweep`` times
  0.8-1): rings fade, vanish and change sign along their arcs. A generic denoiser leaves
  the rings and bands (coherent structure, not noise); an image-domain ring correction
  has to estimate the centre and a profile per radius from the noisy image, the bands
  cannot be told from anatomy and the swing defeats an angular average. The model
  locates the isocentre by matching the calibrated profile, fits the gain's few
  coefficients over the whole slice and subtracts the artifact.

TRAP (intensity convention): the model works on intensities normalized from the HU
window [-1000, 1000] to [0, 1]: its flat-region mask, gain range and total-variation
weight are in those units. Given HU, no pixel passes the mask (no artifact is removed)
and the regularization is 2000x too weak: it returns its input unchanged. A pilot that
measures the noise before and after (and that the mean HU is preserved) catches it.
Tiers: the easy tier draws the noise and the gain's swing from the lower half of the
split's ranges, the hard tier from the upper half.
Metric: per case, ``(s - s_in) / (1 - s_in)`` clipped to [0, 1], where ``s`` is the SSIM
of the output to the clean slices and ``s_in`` that of the noisy input (both in the
soft-tissue window [-160, 240] HU, over the body: :func:`_ssim`): the share of the
input's gap to a perfect image that the output closes. The model does not score 1,
and a better denoiser scores more.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import nifti_bytes
from bat_gym.envs.medbench_lite.models import enhancement as model
from bat_gym.envs.medbench_lite.scripts import recipe_scripts
from bat_gym.envs.medbench_lite.teacher import Recipe
from bat_gym.envs.medbench_lite.tracks.base import (
    Draw,
    Split,
    TrackBase,
    case_ids,
    difficulty,
    read_output_volume,
    resolve_output,
    tier_bounds,
    uniform,
)

__all__ = ["Enhancement"]

_WINDOW_HU = (-160.0, 240.0)
_FOV_MM = 350.0
_HU_WINDOW = (-1000.0, 1000.0)
_KERNEL_CUTOFF = 0.3
"""Cutoff of the reconstruction kernel's Hann apodization, cycles per pixel."""
_GAIN = (0.7, 1.3)
"""Per-slice drift gain of the calibrated artifact profile (1 = as calibrated)."""
_HARMONICS = 5
"""Harmonics of the angle about the isocentre in the gain's swing around the circle."""
_ISO_OFFSET_MM = 30.0
"""Largest offset of the isocentre from the image centre, per axis, mm (patient centring)."""
_RADIUS_GRID = np.linspace(0.0, 1.5, 601)
"""Radius grid of the calibration profile, in units of the image half-width."""
_SCANNER_SEED = 20_190_401
"""Seed of the scanner's calibration (:func:`_scanner_profile`), fixed: one scanner."""
_SEGMENT_HARMONICS = np.arange(8, 25)
"""Harmonics of the angle in the rings' segment pattern (detector modules), fixed per ring."""

MODEL_CARD = """# Model card: ldct-calibrated v2.0

Restores low-dose abdominal CT slices from this scanner: removes its ring and radial
shading artifact, then the quantum noise.
Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).

## Method
1. Artifact: the scanner's calibrated radial profile per detector row (weights
   `artifact_profile` on `artifact_radius`, in image half-widths) plus the rings'
   segment pattern (radial factors `segment_cos`, `segment_sin` of the angular
   harmonics `segment_harmonics`), centred on the
   isocentre: within `max_offset` of the image centre, found per stack by matching
   the profile. Per slice a gain varying around the circle (mean and
   `sweep_harmonics` harmonics of the angle; channel gains drift during the
   rotation) is fitted by least squares on high-passed, edge-free pixels and the
   scaled profile subtracted.
2. Noise: total-variation denoising (Chambolle; `tv_weight`, `tv_iters`).

## Input convention
- `x`: **normalized intensities**, not HU: the HU window [-1000, 1000] (weights
  `hu_window`) mapped linearly to [0, 1] with `infer_lib.to_unit(hu, W)`. The edge
  mask (`edge_grad`), the fit and the TV weight are tuned in these units.
- 2D slice (detector row 0), or a stack with slices along the last axis, slice k
  from detector row k. The scan field of view fills the image.

## Output
Restored normalized intensities, same shape. Convert back with
`infer_lib.from_unit(x, W)` to Hounsfield units.

## Expected behaviour
Noise (std of horizontal pixel differences / sqrt 2, robust) drops 4-8x in soft
tissue; the mean HU of the body moves by less than 10 HU.

## Usage
    W = infer_lib.load("model/weights.npz")
    hu_out = infer_lib.from_unit(infer_lib.denoise(infer_lib.to_unit(hu, W), W), W)
"""

TASK_MD = """Restore every low-dose CT slice stack in `data/images/` (`<id>.nii.gz`, NIfTI-1,
slices along the last axis; case ids in task.json): remove the quantum noise and the
scanner's artifacts.

Output per case: `outputs/denoised/<id>.nii.gz`, float32 **in Hounsfield units**, same
shape and affine as the input. Submission: `outputs/submission.csv` with columns
`id,output_file`, one row per case id.
Metric: SSIM to the clean reference in the soft-tissue window (HU clipped to
[-160, 240]) over the body, as the share of the noisy input's gap to a perfect image
that the output closes: (SSIM(output) - SSIM(input)) / (1 - SSIM(input)), clipped to
[0, 1]. The reference is free of noise and artifacts. A missing case scores the task 0.
"""


def _scanner_profile() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scanner's artifact calibration per detector row, normalized units.

    Returns:
        ``(profile, segment_cos, segment_sin)``. ``profile`` ``(3, len(_RADIUS_GRID))``: for
        each of the three detector rows, the artifact's mean over the angle (HU / 2000,
        the model's normalized scale) at each radius of ``_RADIUS_GRID``. Twenty rings
        per row (Gaussian profiles of sigma 3-12 mm, signed amplitudes 10-30 HU) over
        three broad shading bands (sigma 25-50 mm, 12-25 HU), shifted to zero mean over
        the disc of radius 0.8 (area-weighted) so that the artifact moves the mean HU of
        the body little (a few HU; the pilot allows 10). ``segment_cos`` and ``segment_sin``
        ``(3, len(_SEGMENT_HARMONICS), len(_RADIUS_GRID))``: the rings are segmented (each
        spans detector modules of unequal drift), each ring's amplitude along its arc
        is ``1 + a cos(k angle + phi)`` with ``k`` in ``_SEGMENT_HARMONICS``, ``a`` 0.9-1.4
        (segments of opposite drift: the ring changes sign) and ``phi`` fixed per ring: the radial factors of ``cos(k angle)`` and
        ``sin(k angle)`` for each ``k``. The same for every task.
    """
    rng = np.random.default_rng(_SCANNER_SEED)
    # A separate stream for the segments, so the mean profile is the one calibrated before.
    seg_rng = np.random.default_rng(_SCANNER_SEED + 1)
    half_mm = _FOV_MM / 2
    r = _RADIUS_GRID
    rows, fine_c, fine_s = [], [], []
    scale = _HU_WINDOW[1] - _HU_WINDOW[0]
    for _ in range(3):
        prof = np.zeros_like(r)
        fc = np.zeros((len(_SEGMENT_HARMONICS), len(r)))
        fs = np.zeros_like(fc)
        for _ring in range(20):
            r0, w = rng.uniform(5, 170) / half_mm, rng.uniform(3, 12) / half_mm
            ring = rng.choice([-1, 1]) * rng.uniform(10, 30) * np.exp(-0.5 * ((r - r0) / w) ** 2)
            prof += ring
            j = int(seg_rng.integers(len(_SEGMENT_HARMONICS)))
            amp, phase = seg_rng.uniform(0.9, 1.4), seg_rng.uniform(0, 2 * np.pi)
            # a cos(k t + phi) = a cos(phi) cos(k t) - a sin(phi) sin(k t)
            fc[j] += amp * np.cos(phase) * ring
            fs[j] -= amp * np.sin(phase) * ring
        for _band in range(3):
            r0, w = rng.uniform(0, 120) / half_mm, rng.uniform(25, 50) / half_mm
            prof += rng.choice([-1, 1]) * rng.uniform(12, 25) * np.exp(-0.5 * ((r - r0) / w) ** 2)
        disc = r <= 0.8
        prof -= np.sum(prof[disc] * r[disc]) / np.sum(r[disc])
        rows.append(prof / scale)
        fine_c.append(fc / scale)
        fine_s.append(fs / scale)
    return np.stack(rows), np.stack(fine_c), np.stack(fine_s)


def _polar(size: int, offset: tuple[float, float] = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel centre: distance (image half-widths) and angle (rad) about the isocentre.

    ``offset`` is the isocentre's (row, column) offset from the image centre, pixels.
    """
    rr, cc = np.mgrid[:size, :size] + 0.5 - size / 2
    rr, cc = rr - offset[0], cc - offset[1]
    return np.hypot(rr, cc) / (size / 2), np.arctan2(rr, cc)


def _ct_noise(rng: np.random.Generator, size: int, std_hu: float) -> np.ndarray:
    """One slice of reconstructed quantum noise, HU, std ``std_hu``, shape ``(size, size)``.

    White noise shaped in the Fourier domain to a filtered-back-projection noise power
    spectrum: ramp ``|f|`` times the squared Hann apodization of the kernel up to
    ``_KERNEL_CUTOFF`` cycles/px (amplitude filter: its square root).
    """
    f = np.hypot(np.fft.fftfreq(size)[:, None], np.fft.fftfreq(size)[None, :])
    hann = np.where(f < _KERNEL_CUTOFF, 0.5 * (1 + np.cos(np.pi * f / _KERNEL_CUTOFF)), 0.0)
    shaped = np.real(np.fft.ifft2(np.fft.fft2(rng.normal(size=(size, size))) * np.sqrt(f) * hann))
    return shaped * (std_hu / shaped.std())


def _phantom(rng: np.random.Generator, size: int) -> np.ndarray:
    """A clean 3-slice abdominal stack in HU (slices on the last axis)."""
    rr, cc = (np.mgrid[:size, :size] + 0.5) / size * 2 - 1
    jit = rng.uniform(-0.03, 0.03, size=5)
    gas = [
        (rng.uniform(-0.3, 0.2), rng.uniform(-0.1, 0.5), rng.uniform(0.03, 0.07)) for _ in range(3)
    ]
    liver_hu, tissue_hu = rng.uniform(55, 68), rng.uniform(35, 48)
    slices = []
    for z in range(3):
        j = jit + 0.01 * z
        hu = np.full((size, size), -1000.0)
        hu[(cc / (0.9 + j[0])) ** 2 + ((rr - 0.05) / (0.68 + j[1])) ** 2 <= 1] = -100.0
        inner = (cc / (0.8 + j[0])) ** 2 + ((rr - 0.05) / (0.58 + j[1])) ** 2 <= 1
        hu[inner] = tissue_hu
        # Patient's right is on the image left (radiological display).
        hu[
            inner & (((cc + 0.35) / (0.33 + j[2])) ** 2 + ((rr + 0.05) / (0.32 + j[3])) ** 2 <= 1)
        ] = liver_hu
        for s in (-1, 1):
            hu[((cc - s * 0.3) / 0.1) ** 2 + ((rr - 0.3) / (0.14 + j[4])) ** 2 <= 1] = 30.0
        hu[(cc / 0.13) ** 2 + ((rr - 0.45) / 0.12) ** 2 <= 1] = 700.0
        hu[(cc / 0.07) ** 2 + ((rr - 0.45) / 0.06) ** 2 <= 1] = 250.0
        hu[(cc - 0.05) ** 2 + (rr - 0.25) ** 2 <= 0.06**2] = 180.0
        for gy, gx, gr in gas:
            hu[(cc - gx) ** 2 + (rr - gy - 0.01 * z) ** 2 <= gr**2] = -900.0
        slices.append(hu)
    # Partial volume at organ edges.
    return metrics._box_filter(np.stack(slices, axis=-1), 3)


class Enhancement(TrackBase):
    """Low-dose CT restoration (scanner rings, shading, noise) with a normalized-intensity trap."""

    name = "enhancement"
    metric = "ssim_scaled"
    description = "Restore low-dose CT slices (NIfTI): remove artifacts and noise, return HU."
    index = 3
    ranges = {
        "train": {"noise_hu": (4.0, 7.5), "image_px": (88.0, 96.0), "sweep": (0.15, 0.29)},
        "heldout": {"noise_hu": (8.0, 16.0), "image_px": (104.0, 112.0), "sweep": (0.3, 0.5)},
    }

    def weights(self) -> dict[str, np.ndarray]:
        """The model's parameters (the same for every task): the scanner's calibration."""
        profile, seg_cos, seg_sin = _scanner_profile()
        return {
            "hu_window": np.array(_HU_WINDOW),
            "artifact_radius": _RADIUS_GRID.copy(),
            "artifact_profile": profile,
            "segment_harmonics": _SEGMENT_HARMONICS.copy(),
            "segment_cos": seg_cos,
            "segment_sin": seg_sin,
            "gain_range": np.array([0.5, 1.5]),
            "sweep_harmonics": np.array(_HARMONICS),
            "max_sweep": np.array(0.6),
            "max_offset": np.array(0.25),
            "fit_highpass_px": np.array(2.0),
            "fit_passes": np.array(2),
            "edge_grad": np.array(15.0 / (_HU_WINDOW[1] - _HU_WINDOW[0])),
            "tv_weight": np.array(40.0 / (_HU_WINDOW[1] - _HU_WINDOW[0])),
            "tv_iters": np.array(80),
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        # Easy tier: the lighter half of the split's dose reductions, hard the heavier.
        noise = uniform(rng, tier_bounds(rg["noise_hu"], tier))
        # The gain's swing around the circle (per harmonic, relative): larger when harder.
        sweep = uniform(rng, tier_bounds(rg["sweep"], tier))
        size = int(rng.integers(int(rg["image_px"][0]), int(rg["image_px"][1]) + 1))
        n = int(rng.integers(3, 5))
        ids = case_ids(rng, "ldct", n)
        w = self.weights()
        files: dict[str, bytes] = {}
        answers: dict[str, dict] = {"clean": {}, "affines": {}, "ssim_noisy": {}, "isocentre": {}}
        px = _FOV_MM / size
        hu_per_unit = _HU_WINDOW[1] - _HU_WINDOW[0]
        for cid in ids:
            clean = _phantom(rng, size)
            scan = clean.copy()
            # The patient, not the isocentre, is centred in the reconstructed field.
            off_r, off_c = rng.uniform(-1, 1, 2) * _ISO_OFFSET_MM / px
            radius, angle = _polar(size, (off_r, off_c))
            answers["isocentre"][cid] = (float(off_r), float(off_c))
            # The provided model's own calibration draws the artifact: its weights
            # describe this scanner exactly.
            rows = [
                model._calibrated(w, z, radius, angle) * hu_per_unit
                for z in range(len(w["artifact_profile"]))
            ]
            for z in range(clean.shape[-1]):
                drift = sum(
                    sweep * rng.uniform(0.8, 1.0) * np.cos(k * angle - rng.uniform(0, 2 * np.pi))
                    for k in range(1, _HARMONICS + 1)
                )
                gain = uniform(rng, _GAIN) * (1 + drift)
                scan[..., z] += gain * rows[z] + _ct_noise(rng, size, noise)
            stored = np.clip(np.rint(scan) + 1024, 0, 4095).astype(np.uint16)
            affine = np.diag([-px, -px, 5.0, 1.0])
            affine[:3, 3] = [_FOV_MM / 2, _FOV_MM / 2, float(rng.uniform(-200, 200))]
            files[f"data/images/{cid}.nii.gz"] = nifti_bytes(
                stored, affine, slope=1.0, inter=-1024.0, descrip="MedBench-Lite low-dose CT"
            )
            noisy = stored.astype(np.float64) - 1024.0
            answers["clean"][cid] = clean.astype(np.float32)
            answers["ssim_noisy"][cid] = _ssim(noisy, clean)
            answers["affines"][cid] = affine
        task_json = {
            "inputs": {
                "format": "NIfTI-1",
                "dir": "data/images",
                "pattern": "{id}.nii.gz",
                "units": "HU",
            },
            "output": {
                "kind": "nifti_image",
                "dir": "outputs/denoised",
                "pattern": "{id}.nii.gz",
                "dtype": "float32",
                "units": "HU",
                "grid": "same shape and affine as the input",
            },
            "submission": {"columns": ["id", "output_file"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={
                "difficulty": tier,
                "cases": n,
                "noise_hu": noise,
                "image_px": size,
                "sweep": sweep,
            },
            files=files,
            weights=w,
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers=answers,
        )

    def score_case(self, draw: Draw, workspace: Path, row: Mapping[str, str], cid: str) -> float:
        """The share of the input's SSIM gap to the clean image that the output closes."""
        clean = draw.answers["clean"][cid]
        path = resolve_output(workspace, row.get("output_file", ""))
        out = read_output_volume(path, clean.shape, draw.answers["affines"][cid])
        s = None if out is None else _ssim(out, clean)
        if s is None or not np.isfinite(s):
            return 0.0
        lo = draw.answers["ssim_noisy"][cid]
        # The share of the gap between the input and a perfect image that the output
        # closes: no ceiling below perfect, so a better denoiser than the model ranks.
        return float(np.clip((s - lo) / max(1.0 - lo, 1e-6), 0.0, 1.0))

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Load every data/images/<id>.nii.gz with nibabel (get_fdata applies scl_slope/scl_inter, "
                "giving HU). The model card wants the HU window [-1000, 1000] normalized to [0, 1] with "
                "infer_lib.to_unit.",
                "pipeline/infer.py runs infer_lib.denoise (calibrated artifact removal, then total "
                "variation) on the normalized stack and converts back with from_unit. Validate on one case: the noise (robust std of horizontal differences) must drop "
                "at least 1.5x and the mean body HU must not move by 10 HU or more.",
                "Save outputs/denoised/<id>.nii.gz as float32 HU with the input affine, write "
                "outputs/predictions.csv, then outputs/submission.csv (id,output_file) in task.json order, "
                "with receipts.",
            ),
            out_dir="outputs/denoised",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, opening every stack (dtype, scaling, HU range), then "
                "pinning the model and smoke-testing it on a flat noisy patch.",
                "pipeline": "The model card tunes its edge mask, artifact fit and TV weight in normalized "
                "units, so the pipeline maps HU to [0, 1] before the model and back to HU after.",
                "pipeline_bug": "Writing the pipeline: load each stack in HU, denoise it, save it with the "
                "input affine.",
                "pilot": "Pilot on one case, measuring the noise before and after and the mean HU, against "
                "the 4-8x reduction the card promises.",
                "bug_seen": "The noise did not drop at all: given HU, every pixel looks like an edge to the "
                "artifact fit and the TV weight is 2000x too weak, so the model returns its input. It "
                "wants normalized intensities.",
                "fix": "Normalizing with to_unit before the model and converting back with from_unit, then "
                "rerunning the pilot.",
            },
        )


def _ssim(pred: np.ndarray, clean: np.ndarray) -> float:
    """SSIM in the soft-tissue display window over the body (slices compared in 2D).

    Both images are clipped to ``_WINDOW_HU`` (the abdominal window a reader looks at)
    and compared with :func:`~bat_gym.envs.medbench_lite.metrics.ssim` (data range: the
    window's width) over the interior pixels of the body (clean HU above -500).
    """
    lo, hi = _WINDOW_HU
    c = lambda a: np.clip(np.asarray(a, dtype=np.float64), lo, hi)  # noqa: E731
    return metrics.ssim(c(pred), c(clean), hi - lo, mask=np.asarray(clean) > -500.0)
