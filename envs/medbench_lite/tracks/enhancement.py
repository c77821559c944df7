"""Enhancement track: denoising low-dose-like CT slices (NIfTI).

Each case is a short stack of abdominal CT slices with low-dose-like noise, stored as
uint16 with ``scl_inter = -1024`` (nibabel's ``get_fdata`` returns HU).

TRAP (intensity convention): the denoiser's range kernel is tuned for intensities
normalized from the HU window [-1000, 1000] to [0, 1]. Given HU, every neighbour looks
like an edge and the filter returns its input unchanged: a do-nothing result. A pilot
that measures the noise before and after (and that the mean HU is preserved) catches it.
Tiers: the easy tier draws the noise from the lower half of the split's range, the hard
tier from the upper half.
Metric: per case, ``(s - s_in) / (1 - s_in)`` clipped to [0, 1], where ``s`` is the SSIM
of the output to the clean slices and ``s_in`` that of the noisy input (both in the
soft-tissue window [-160, 240] HU, over the body: :func:`_ssim`): the share of the
input's gap to a perfect image that the output closes. The model does not score 1,
and a better denoiser scores more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import nifti_bytes
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

MODEL_CARD = """# Model card: ldct-bilateral v1.1

Edge-preserving denoiser for low-dose abdominal CT slices.
Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).

## Input convention
- `x`: **normalized intensities**, not HU: the HU window [-1000, 1000] (weights
  `hu_window`) mapped linearly to [0, 1] with `infer_lib.to_unit(hu, W)`. The range
  kernel is tuned in these units.
- 2D slice, or a stack with slices along the last axis.

## Output
Denoised normalized intensities, same shape. Convert back with
`infer_lib.from_unit(x, W)` to Hounsfield units.

## Expected behaviour
Noise (std of horizontal pixel differences / sqrt 2, robust) drops 2-4x in soft
tissue; the mean HU of the body is unchanged (within a few HU).

## Usage
    W = infer_lib.load("model/weights.npz")
    hu_out = infer_lib.from_unit(infer_lib.denoise(infer_lib.to_unit(hu, W), W), W)
"""

TASK_MD = """Denoise every low-dose CT slice stack in `data/images/` (`<id>.nii.gz`, NIfTI-1,
slices along the last axis; case ids in task.json).

Output per case: `outputs/denoised/<id>.nii.gz`, float32 **in Hounsfield units**, same
shape and affine as the input. Submission: `outputs/submission.csv` with columns
`id,output_file`, one row per case id.
Metric: SSIM to the clean reference in the soft-tissue window (HU clipped to
[-160, 240]) over the body, as the share of the noisy input's gap to a perfect image
that the output closes: (SSIM(output) - SSIM(input)) / (1 - SSIM(input)), clipped to
[0, 1]. A missing case scores the task 0.
"""

PIPELINE = '''
"""Low-dose CT denoising for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import nibabel as nib
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "output_file"]


def denoise_hu(hu):
    """Denoised slices, in HU."""
__DENOISE__


def run(ids, out_csv, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for cid in ids:
        img = nib.load(os.path.join(ROOT, "data", "images", cid + ".nii.gz"))
        out = nib.Nifti1Image(denoise_hu(img.get_fdata()).astype(np.float32), img.affine)
        out.set_sform(img.affine, code=1)
        out.set_qform(img.affine, code=1)
        path = os.path.join(out_dir, cid + ".nii.gz")
        nib.save(out, path)
        rows.append({"id": cid, "output_file": os.path.relpath(os.path.abspath(path), ROOT)})
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
'''

_DENOISE_GOOD = """    # The range kernel is tuned for the normalized window, not for HU.
    return infer_lib.from_unit(infer_lib.denoise(infer_lib.to_unit(hu, W), W), W)"""

_DENOISE_BUG = """    return infer_lib.denoise(hu, W)"""

INSPECT = """
import nibabel as nib
cases = {}
for i in case_ids:
    img = nib.load(f"data/images/{i}.nii.gz")
    hu = img.get_fdata()
    cases[i] = {"shape": list(img.shape), "stored_dtype": str(img.get_data_dtype()),
                "scl_slope_inter": [float(img.dataobj.slope), float(img.dataobj.inter)],
                "hu_range": [round(float(hu.min())), round(float(hu.max()))]}
compat = {"input_format": "NIfTI-1 .nii.gz", "readable": len(cases), "expected": len(case_ids), "cases": cases,
          "model_input": "HU window [-1000, 1000] normalized to [0, 1] (model card)"}
print(len(cases), "of", len(case_ids), "stacks readable")
for i, c in cases.items():
    print(i, c["shape"], c["stored_dtype"], "scl slope/inter", c["scl_slope_inter"], "HU", c["hu_range"])
"""

SMOKE = """
import numpy as np
rng = np.random.default_rng(0)
flat = infer_lib.to_unit(40 + rng.normal(0, 40, (32, 32)), W)
out = infer_lib.denoise(flat, W)
smoke = {"input": "32x32 flat 40 HU, noise 40 HU (normalized)", "std_in_hu": round(float(infer_lib.from_unit(flat, W).std()), 1),
         "std_out_hu": round(float(infer_lib.from_unit(out, W).std()), 1)}
"""

PILOT = """
import nibabel as nib
import numpy as np
def noise_hu(a, body):
    d = np.diff(a, axis=1)[body[:, 1:] & body[:, :-1]]
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
img = nib.load(f"data/images/{case_id}.nii.gz")
hu = img.get_fdata()
out_img = nib.load(rows[0]["output_file"])
out = out_img.get_fdata()
body = (hu > -300) & (hu < 300)
n_in, n_out = noise_hu(hu, body), noise_hu(out, body)
shift = float(out[body].mean() - hu[body].mean())
print("pilot", case_id, "noise HU in", round(n_in, 1), "out", round(n_out, 1))
checks = {
    "output on input grid": {"value": list(out.shape), "expect": list(hu.shape),
                             "ok": out.shape == hu.shape and bool(np.allclose(out_img.affine, img.affine, atol=1e-3))},
    "noise reduction factor (card: 2-4x)": {"value": round(n_in / max(n_out, 1e-6), 2), "expect": ">= 1.5", "ok": n_in / max(n_out, 1e-6) >= 1.5},
    "mean body HU shift": {"value": round(shift, 1), "expect": "|shift| < 10", "ok": abs(shift) < 10},
}
"""

WEAK_PILOT = """
import nibabel as nib
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
shape_in = nib.load(f"data/images/{case_id}.nii.gz").shape
shape_out = nib.load(rows[0]["output_file"]).shape
checks = {"output shape equals input shape": {"value": list(shape_out), "expect": list(shape_in), "ok": shape_out == shape_in}}
"""

SUBMIT_CHECK = """
import nibabel as nib
import numpy as np
for r in rows:
    img = nib.load(f"data/images/{r['id']}.nii.gz")
    out = nib.load(r["output_file"])
    if out.shape != img.shape or not np.allclose(out.affine, img.affine, atol=1e-3):
        problems.append(r["id"] + ": output grid differs from the input")
"""


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
    """Low-dose CT denoising with a normalized-intensity trap."""

    name = "enhancement"
    metric = "ssim_scaled"
    description = "Denoise low-dose CT slices (NIfTI) and return them in HU."
    index = 3
    ranges = {
        "train": {"noise_hu": (15.0, 35.0), "image_px": (88.0, 96.0)},
        "heldout": {"noise_hu": (40.0, 60.0), "image_px": (104.0, 112.0)},
    }

    def weights(self) -> dict[str, np.ndarray]:
        """The model's parameters (the same for every task)."""
        return {
            "hu_window": np.array([-1000.0, 1000.0]),
            "radius": np.array(2),
            "sigma_spatial": np.array(1.5),
            "sigma_range": np.array(0.05),
            "passes": np.array(2),
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        # Easy tier: the lighter half of the split's dose reductions, hard the heavier.
        noise = uniform(rng, tier_bounds(rg["noise_hu"], tier))
        size = int(rng.integers(int(rg["image_px"][0]), int(rg["image_px"][1]) + 1))
        n = int(rng.integers(3, 5))
        ids = case_ids(rng, "ldct", n)
        w = self.weights()
        files: dict[str, bytes] = {}
        answers: dict[str, dict] = {"clean": {}, "affines": {}, "ssim_noisy": {}}
        px = _FOV_MM / size
        for cid in ids:
            clean = _phantom(rng, size)
            stored = np.clip(
                np.rint(clean + rng.normal(0, noise, clean.shape)) + 1024, 0, 4095
            ).astype(np.uint16)
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
            params={"difficulty": tier, "cases": n, "noise_hu": noise, "image_px": size},
            files=files,
            weights=w,
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers=answers,
        )

    def score_cases(  # noqa: D102
        self,
        draw: Draw,
        workspace: Path,
        rows: Mapping[str, Mapping[str, str]],
        ids: Sequence[str],
    ) -> float:

        per_case = []
        for cid in ids:
            clean = draw.answers["clean"][cid]
            path = resolve_output(workspace, rows[cid].get("output_file", ""))
            out = read_output_volume(path, clean.shape, draw.answers["affines"][cid])
            s = None if out is None else _ssim(out, clean)
            if s is None or not np.isfinite(s):
                per_case.append(0.0)
                continue
            lo = draw.answers["ssim_noisy"][cid]
            # The share of the gap between the input and a perfect image that the output
            # closes: no ceiling below perfect, so a better denoiser than the model ranks.
            per_case.append(float(np.clip((s - lo) / max(1.0 - lo, 1e-6), 0.0, 1.0)))
        return float(np.mean(per_case))

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Load every data/images/<id>.nii.gz with nibabel (get_fdata applies scl_slope/scl_inter, "
                "giving HU). The model card wants the HU window [-1000, 1000] normalized to [0, 1] with "
                "infer_lib.to_unit.",
                "pipeline/infer.py runs infer_lib.denoise on the normalized stack and converts back with "
                "from_unit. Validate on one case: the noise (robust std of horizontal differences) must drop "
                "at least 1.5x and the mean body HU must not move by 10 HU or more.",
                "Save outputs/denoised/<id>.nii.gz as float32 HU with the input affine, write "
                "outputs/predictions.csv, then outputs/submission.csv (id,output_file) in task.json order, "
                "with receipts.",
            ),
            inspect=INSPECT,
            smoke=SMOKE,
            pipeline=PIPELINE.replace("__DENOISE__", _DENOISE_GOOD),
            pipeline_bug=PIPELINE.replace("__DENOISE__", _DENOISE_BUG),
            naive_pipeline=PIPELINE.replace("__DENOISE__", _DENOISE_BUG),
            pilot=PILOT,
            weak_pilot=WEAK_PILOT,
            out_dir="outputs/denoised",
            submit_check=SUBMIT_CHECK,
            says={
                "inspect": "Recording the environment, opening every stack (dtype, scaling, HU range), then "
                "pinning the model and smoke-testing it on a flat noisy patch.",
                "pipeline": "The model card tunes the range kernel in normalized units, so the pipeline maps "
                "HU to [0, 1] before the model and back to HU after.",
                "pipeline_bug": "Writing the pipeline: load each stack in HU, denoise it, save it with the "
                "input affine.",
                "pilot": "Pilot on one case, measuring the noise before and after and the mean HU, against "
                "the 2-4x reduction the card promises.",
                "bug_seen": "The noise did not drop at all: given HU, the range kernel treats every neighbour "
                "as an edge and the filter returns its input. The model wants normalized intensities.",
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
