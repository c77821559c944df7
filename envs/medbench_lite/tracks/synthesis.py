"""Synthesis track: MR contrast A (T1-like) -> contrast B (T2-like) head volumes (NIfTI).

Each task has paired training cases (A and B) and test cases (A only). Every scanner
session has its own intensity gain, far from 1 (hundreds to thousands of units).
Heads have scalp fat, skull, CSF, grey and white matter. Scalp fat and white matter are
both bright in A while B keeps fat bright and makes white matter dark; bone and CSF are
both dark in A while B makes CSF bright. A table on A's intensity alone (what one fits
on the two training pairs) cannot tell them apart; the model's table has a row per
depth below the head's surface. Tiers: the hard tier draws the noise from the upper
half of the split's range.

TRAP (intensity normalization): the model's lookup table was fitted on foreground-
normalized intensities. Fed scanner units, every voxel falls off the end of the table
and the output is a constant. Validating on a training pair (A through the pipeline,
compared with its B) catches it at once.
Metric: SSIM inside the head mask after dividing prediction and reference by their
mean in the mask (the B scanner's gain is unknowable, so it is factored out).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import nifti_bytes
from bat_gym.envs.medbench_lite.models import synthesis as model
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

__all__ = ["Synthesis"]

# Relative intensities per tissue. Scalp fat and white matter are alike in A and far
# apart in B, and so are cortical bone and CSF: only anatomy (depth below the scalp)
# tells them apart.
_A = {"csf": 0.22, "gm": 0.55, "wm": 0.85, "bone": 0.12, "fat": 0.9}
_B = {"csf": 1.0, "gm": 0.55, "wm": 0.35, "bone": 0.08, "fat": 0.95}
_VOXEL_MM = (3.0, 3.0, 6.0)

MODEL_CARD = """# Model card: mr-lut v2.0

Translates contrast A (T1-like) head MR volumes to contrast B (T2-like).
Parameters: model/weights.npz (a lookup table with a row per depth below the head's
surface). Code: model/infer_lib.py (numpy).

## Input convention
- `a_norm`: contrast A **normalized**: divided by the 95th percentile of the
  foreground (voxels above 10% of the 99.5th percentile), i.e.
  `a_norm, scale = infer_lib.normalize(a, W)`. The table covers a_norm in 0-1.6;
  raw scanner units (hundreds to thousands) fall off its end.
- `predict` smooths each slice in-plane (a 5-tap Gaussian-like kernel) before the
  table, which was fitted on noisy inputs against noise-free B. Each voxel's depth
  below the head's surface (`infer_lib.depth`) picks the table's row: scalp fat and
  white matter look alike in A, and so do bone and CSF, but not in B.

## Output
Contrast B in the same normalized units (white matter about 0.35, CSF about 1.0).
Scanner gains differ per session; outputs are compared after dividing by their
mean inside the head, so no rescaling to B units is needed.

## Expected behaviour
On the provided training pairs: Pearson r > 0.8 and normalized MAE < 0.2 inside the
head (both volumes divided by their mean there).

## Usage
    W = infer_lib.load("model/weights.npz")
    b = infer_lib.predict(infer_lib.normalize(a, W)[0], W)
"""

TASK_MD = """Synthesize contrast B for every test volume `data/test/<id>_A.nii.gz` (NIfTI-1,
contrast A; case ids in task.json). Paired examples for validation:
`data/train/<pair>_A.nii.gz` with `data/train/<pair>_B.nii.gz`.

Output per case: `outputs/synth/<id>.nii.gz`, float32, same shape and affine as the
input. Submission: `outputs/submission.csv` with columns `id,output_file`, one row
per case id.
Metric: SSIM inside the head, after dividing output and reference by their mean
there. A missing case scores the task 0.
"""


def _head(
    rng: np.random.Generator, shape: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noise-free contrast A and B (relative units) and the head mask of one phantom."""
    x, y, z = np.meshgrid(*[(np.arange(n) + 0.5) / n * 2 - 1 for n in shape], indexing="ij")
    j = rng.uniform(0.95, 1.05, size=3)
    rad = np.sqrt((x / (0.85 * j[0])) ** 2 + (y / (0.88 * j[1])) ** 2 + (z / (0.9 * j[2])) ** 2)
    shift = rng.uniform(-0.04, 0.04)
    vent = ((x - 0.12 - shift) / 0.1) ** 2 + (y / 0.3) ** 2 + (z / 0.35) ** 2 <= 1
    vent |= ((x + 0.12 - shift) / 0.1) ** 2 + (y / 0.3) ** 2 + (z / 0.35) ** 2 <= 1
    # Gyral folding of the grey/white boundary.
    fold = (
        0.05
        * np.sin(rng.uniform(5, 9) * np.arctan2(y, x) + rng.uniform(0, 6))
        * np.cos(rng.uniform(3, 6) * z)
    )
    scalp = rng.uniform(0.84, 0.88)  # inner edge of the scalp fat
    skull = scalp - rng.uniform(0.07, 0.1)
    wm = (rad <= skull - rng.uniform(0.2, 0.26) + fold) & ~vent
    gm = (rad <= skull - 0.06) & ~wm & ~vent
    csf = (rad <= skull) & ~wm & ~gm
    bone = (rad <= scalp) & (rad > skull)
    fat = (rad <= 1.0) & (rad > scalp)
    frac = {
        k: metrics._box_filter(m.astype(np.float64), 3)
        for k, m in (("csf", csf), ("gm", gm), ("wm", wm), ("bone", bone), ("fat", fat))
    }
    a = sum(frac[k] * _A[k] for k in frac)
    b = sum(frac[k] * _B[k] for k in frac)
    return a, b, rad <= 1.0


# The model's training data: phantoms at noise levels spanning the *training* split's
# range only, so held-out tasks (noisier) test generalization, not memorization.
_FIT_NOISE = (0.015, 0.0225, 0.03)
_FIT_REPEATS = 3
# Rows of the lookup table: depth 0 (outside) to _DEPTHS - 1 voxels and deeper.
_DEPTHS = 9


@functools.lru_cache(maxsize=1)
def _weights() -> dict[str, np.ndarray]:
    """Fit the lookup table once on fixed phantoms (the model's "training").

    Inputs are noisy contrast A, normalized and smoothed in-plane exactly as
    :func:`~bat_gym.envs.medbench_lite.models.synthesis.predict` does; targets are the
    noise-free contrast B, normalized. Each table entry is the mean target of its bin.
    """
    rng = np.random.default_rng(20240611)
    w: dict[str, np.ndarray] = {
        "fg_fraction": np.array(0.1),
        "norm_percentile": np.array(95.0),
        "background_below": np.array(0.1),
        "depth_z_every": np.array(2),
        # Binomial (1, 4, 6, 4, 1) / 16: a Gaussian of about one voxel; wider kernels
        # blur tissue boundaries more than they remove noise.
        "smooth_kernel": np.array([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0,
    }
    xs, ys, ds = [], [], []
    for noise in _FIT_NOISE:
        for _ in range(_FIT_REPEATS):
            a, b, _m = _head(rng, (60, 72, 18))
            an = np.abs(a + rng.normal(0, noise, a.shape))
            sm = model.smooth(model.normalize(an, w)[0], w)
            xs.append(sm.ravel())
            ys.append(model.normalize(b, w)[0].ravel())
            ds.append(model.depth(sm, {**w, "lut_y": np.zeros((_DEPTHS, 1))}).ravel())
    x, y, d = np.concatenate(xs), np.concatenate(ys), np.concatenate(ds)
    edges = np.linspace(0.0, 1.6, 65)
    centers = (edges[:-1] + edges[1:]) / 2
    idx = np.digitize(x, edges) - 1
    rows = []
    for k in range(_DEPTHS):
        at = d == k
        lut = np.array(
            [
                y[at & (idx == j)].mean() if (at & (idx == j)).sum() > 20 else np.nan
                for j in range(64)
            ]
        )
        ok = ~np.isnan(lut)
        rows.append(np.interp(centers, centers[ok], lut[ok]) if ok.any() else np.zeros(64))
    w["lut_x"] = np.round(centers, 6)
    w["lut_y"] = np.round(np.stack(rows), 6)
    return w


class Synthesis(TrackBase):
    """MR contrast synthesis with a scanner-gain normalization trap."""

    name = "synthesis"
    metric = "ssim_masked"
    description = (
        "Synthesize contrast-B MR head volumes from contrast A (NIfTI), with paired examples."
    )
    index = 4
    ranges = {
        "train": {"noise": (0.015, 0.03), "gain": (600.0, 1500.0)},
        "heldout": {"noise": (0.035, 0.05), "gain": (1800.0, 3000.0)},
    }

    def weights(self) -> dict[str, np.ndarray]:
        """The model's parameters (fitted once, the same for every task)."""
        return dict(_weights())

    def _volume(
        self,
        rng: np.random.Generator,
        shape: tuple[int, int, int],
        noise: float,
        gains: tuple[float, float],
    ) -> dict:
        a, b, head = _head(rng, shape)
        ga, gb = gains
        a_raw = np.abs(a + rng.normal(0, noise, a.shape)) * ga
        b_raw = np.abs(b + rng.normal(0, noise, b.shape)) * gb
        affine = np.diag([*_VOXEL_MM, 1.0])
        affine[:3, 3] = rng.uniform(-30, 30, size=3) - np.array(shape) / 2 * np.array(_VOXEL_MM)
        return {
            "a": np.rint(a_raw).astype(np.int16),
            "b": np.rint(b_raw).astype(np.int16),
            "clean_b": b,
            "head": head,
            "affine": affine,
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        # Hard tier: the noisier half of the split's acquisitions.
        noise = uniform(rng, tier_bounds(rg["noise"], tier))
        shape = (int(rng.integers(58, 65)), int(rng.integers(68, 75)), int(rng.integers(16, 21)))
        n = int(rng.integers(3, 5))
        ids = case_ids(rng, "mr", n)
        pairs = tuple(p.replace("mr_", "pair_") for p in case_ids(rng, "mr", 2))
        # One scanner session per volume: gains for contrast A and contrast B.
        gains = [
            (uniform(rng, rg["gain"]), uniform(rng, rg["gain"])) for _ in range(len(pairs) + n)
        ]
        files: dict[str, bytes] = {}
        answers: dict[str, dict] = {"b": {}, "mask": {}, "affines": {}}
        # The training pairs' noise-free B lets S3 score a pilot run on a pair with
        # the task metric; the pairs are public, so this reveals nothing.
        worked: dict[str, dict] = {"b": {}, "mask": {}, "affines": {}}
        for pid, g in zip(pairs, gains, strict=False):
            v = self._volume(rng, shape, noise, g)
            worked["b"][pid] = v["clean_b"].astype(np.float32)
            worked["mask"][pid] = v["head"]
            worked["affines"][pid] = v["affine"]
            files[f"data/train/{pid}_A.nii.gz"] = nifti_bytes(
                v["a"], v["affine"], descrip="MedBench-Lite MR contrast A"
            )
            files[f"data/train/{pid}_B.nii.gz"] = nifti_bytes(
                v["b"], v["affine"], descrip="MedBench-Lite MR contrast B"
            )
        for cid, g in zip(ids, gains[len(pairs) :], strict=True):
            v = self._volume(rng, shape, noise, g)
            files[f"data/test/{cid}_A.nii.gz"] = nifti_bytes(
                v["a"], v["affine"], descrip="MedBench-Lite MR contrast A"
            )
            answers["b"][cid] = v["clean_b"].astype(np.float32)
            answers["mask"][cid] = v["head"]
            answers["affines"][cid] = v["affine"]
        task_json = {
            "inputs": {
                "format": "NIfTI-1",
                "test": "data/test/{id}_A.nii.gz",
                "training_pairs": [
                    f"data/train/{p}_A.nii.gz + data/train/{p}_B.nii.gz" for p in pairs
                ],
            },
            "output": {
                "kind": "nifti_image",
                "dir": "outputs/synth",
                "pattern": "{id}.nii.gz",
                "dtype": "float32",
                "grid": "same shape and affine as the input",
            },
            "submission": {"columns": ["id", "output_file"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={
                "difficulty": tier,
                "cases": n,
                "pairs": len(pairs),
                "noise": noise,
                "gain": round(float(np.mean(gains)), 1),
                "shape": list(shape),
            },
            files=files,
            weights=self.weights(),
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers={**answers, "worked": worked},
        )

    def known_ids(self, draw: Draw) -> frozenset[str]:
        """The test cases and the training pairs (whose B is given)."""
        return frozenset(draw.case_ids) | frozenset(draw.answers["worked"]["b"])

    def score_case(self, draw: Draw, workspace: Path, row: Mapping[str, str], cid: str) -> float:
        """Masked SSIM of the synthesized volume against the truth, both mean-normalised."""
        known = draw.answers if cid in draw.answers["b"] else draw.answers["worked"]
        truth, mask = known["b"][cid], known["mask"][cid]
        path = resolve_output(workspace, row.get("output_file", ""))
        pred = read_output_volume(path, truth.shape, known["affines"][cid])
        if pred is None or not np.all(np.isfinite(pred[mask])) or pred[mask].mean() <= 0:
            return 0.0
        p = pred / pred[mask].mean()
        g = truth / truth[mask].mean()
        s = metrics.ssim(p, g, float(g[mask].max() - g[mask].min()), mask=mask)
        return float(np.clip(s, 0.0, 1.0))

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Load data/test/<id>_A.nii.gz and the training pairs data/train/<pair>_A/_B.nii.gz with "
                "nibabel; record intensity ranges. The model card wants A divided by the 95th percentile of "
                "its foreground (infer_lib.normalize); scanner gains differ per session.",
                "pipeline/infer.py runs infer_lib.predict(infer_lib.normalize(a, W)[0], W). Validate on a "
                "training pair, where B is known: Pearson r > 0.8 and normalized MAE < 0.2 in the head.",
                "Save outputs/synth/<id>.nii.gz as float32 with the input affine, write "
                "outputs/predictions.csv, then outputs/submission.csv (id,output_file) in task.json order, "
                "with receipts.",
            ),
            out_dir="outputs/synth",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, opening the test volumes and the training pairs "
                "(intensity ranges differ per session), then pinning and smoke-testing the model.",
                "pipeline": "The lookup table works on foreground-normalized intensities and these volumes "
                "are in scanner units with different gains, so the pipeline normalizes A first.",
                "pipeline_bug": "Writing the pipeline: load A, predict B with the model, save with the input "
                "affine.",
                "pilot": "Pilot on a training pair, whose contrast B is known, so the output can be compared "
                "with the truth.",
                "bug_seen": "The output is flat (r about 0): scanner-unit intensities run off the end of the "
                "model's lookup table, which was fitted on normalized intensities.",
                "fix": "Normalizing A with infer_lib.normalize before the table, then rerunning the pilot.",
            },
        )
