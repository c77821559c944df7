"""Classification track: focal lung opacity on chest radiographs (DICOM).

Each case is a DICOM radiograph with a per-file RescaleSlope/RescaleIntercept, and
about half are stored MONOCHROME1 (high stored value = dark). Every image holds three
bright, equally sized textured spots inside the lungs among vessels and lung texture:
a positive image has the task's opacity and two look-alikes, a negative image three
look-alikes (:mod:`~bat_gym.envs.medbench_lite.tracks.findings`). Only the texture's
orientation tells them apart, and only the provided model's matched filter knows the
opacity's orientation, so a model-free shortcut is at chance.

Difficulty (:func:`~bat_gym.envs.medbench_lite.tracks.base.difficulty`): on the hard
tier the texture is fainter (``_MODULATION``), and the model, run correctly, confuses
some opacities with look-alikes (balanced accuracy about 0.8-0.9 instead of about 1).

TRAP (photometric inversion and rescale): the model wants modality values in the
MONOCHROME2 sense. Fed a MONOCHROME1 file without the ``4095 - value`` inversion, the
model sees dark lungs as bright and the spots as dark: the spots' matched-filter
response goes negative while the bright lung edges respond, so labels on those files
no longer follow the opacity (measured on training seeds 0-7: 35% of the
MONOCHROME1 files called positive, against 57% truly positive). Fed
``pixel_array`` as stored, every file is off: the slopes (0.25, 0.5, 4) scale every
response by 4, 2 or 1/4, which pushes images across the decision threshold. A pilot on a MONOCHROME1 file that checks
the lungs come out darker than the mediastinum and the values stay in 0..4095 catches
it.
Metric: balanced accuracy of the submitted labels
(:func:`~bat_gym.envs.medbench_lite.metrics.balanced_accuracy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import dicom_bytes
from bat_gym.envs.medbench_lite.scripts import recipe_scripts
from bat_gym.envs.medbench_lite.teacher import Recipe
from bat_gym.envs.medbench_lite.tracks import findings
from bat_gym.envs.medbench_lite.tracks.base import (
    Draw,
    Rows,
    Split,
    TrackBase,
    case_ids,
    difficulty,
    uniform,
)

__all__ = ["Classification"]

_RESCALES = ((1.0, -1024.0), (0.25, 0.0), (4.0, -1024.0), (0.5, -1024.0))
FULL_SCALE = 4095.0
KERNEL_RADIUS = 4.0
KERNEL_DC = 0.5
DECISION = 0.34  # peak response (full-scale units) at p = 0.5
# Texture contrast of a finding (fraction of its brightness) per tier: on the hard
# tier the opacity's texture is faint, so the model confuses it with look-alikes.
_MODULATION = {"easy": (0.6, 0.8), "hard": (0.38, 0.52)}

MODEL_CARD = """# Model card: opacity-matched v3.0

Frontal chest radiograph -> focal lung opacity present (1) or not (0).
Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).
The model was trained on this site's opacities: it tells them from look-alikes
(vessels seen end-on, overlapping shadows) of the same size and brightness by their
internal texture, which its matched filter (`kernel`) holds.

## Input convention
- `values`: 2D array of **modality values**: stored pixels after RescaleSlope and
  RescaleIntercept (pydicom: `pydicom.pixels.apply_modality_lut`).
- **MONOCHROME2 sense**, full scale 4095: 0 = no attenuation (black), 4095 = white.
  Lungs are dark, mediastinum bright. MONOCHROME1 files store inverted values
  (high = dark): convert with `4095 - value` first.

## Output
`classify(values, W)` -> `(label, p_opacity)`. Report confidence = max(p, 1 - p).

## Expected behaviour
Over `lung_roi(shape, W)` the mean is about 500-1300; the central mediastinum strip
(middle 10% of the columns) about 1900-2700.

## Usage
    W = infer_lib.load("model/weights.npz")
    label, p = infer_lib.classify(values, W)
"""

TASK_MD = """Classify every chest radiograph in `data/images/` (`<id>.dcm`, DICOM; case ids in
task.json): 1 = focal lung opacity, 0 = none.

Submission: `outputs/submission.csv` with columns `id,label,confidence`, one row per
case id; label is 0 or 1, confidence the probability of the given label (0.5-1).
Metric: balanced accuracy. A missing case scores the task 0.
"""


def _label(cell: object) -> int:
    """A submitted label as 0 or 1, else -1 (a wrong answer for both classes).

    Anything but 0 or 1 (text, ``nan``, ``inf``, ``1e400``, ``0.5``) is -1.
    """
    try:
        v = float(str(cell))
    except (TypeError, ValueError):
        return -1
    return int(v) if v in (0.0, 1.0) else -1


class Classification(TrackBase):
    """Opacity classification on DICOM radiographs with rescale and MONOCHROME1."""

    name = "classification"
    metric = "balanced_accuracy"
    description = "Classify chest radiographs (DICOM) for a focal lung opacity."
    index = 1
    ranges = {
        "train": {"noise": (40.0, 80.0), "image_px": (96.0, 104.0)},
        "heldout": {"noise": (90.0, 130.0), "image_px": (112.0, 120.0)},
    }

    def weights(self, theta: float = 0.0, period: float = 4.2) -> dict[str, np.ndarray]:
        """The task's model: the lung template, its matched filter and the decision rule."""
        return {
            "full_scale": np.array(FULL_SCALE),
            "roi_ellipses": np.array([[0.45, 0.30, 0.24, 0.11], [0.45, 0.70, 0.24, 0.11]]),
            "background_px": np.array(15),
            "kernel": findings.matched_kernel(theta, period, KERNEL_RADIUS, KERNEL_DC),
            "bias": np.array(DECISION),
            "gain": np.array(40.0),
        }

    def _image(
        self,
        rng: np.random.Generator,
        size: int,
        noise: float,
        kinds: Sequence[int],
        thetas: np.ndarray,
        period: float,
        modulation: tuple[float, float],
    ) -> np.ndarray:
        """Modality values (MONOCHROME2 sense) of one synthetic radiograph.

        Anatomy (torso, two lungs of varying size and position), lung texture and
        vessels, softened by a 3-pixel blur (partial volume at organ edges); then one
        textured disk per entry of ``kinds`` (a :mod:`findings` type) inside a lung,
        then quantum noise.
        """
        shape = (size, size)
        r = (np.arange(size) + 0.5) / size
        rr, cc = np.meshgrid(r, r, indexing="ij")
        m = np.full(shape, 150.0)
        m[:, int(0.06 * size) : int(np.ceil(0.94 * size))] = rng.uniform(2200, 2400)
        lungs = []
        lung_mask = np.zeros(shape, dtype=bool)
        for side in (0.30, 0.70):
            c = (0.45 + rng.uniform(-0.02, 0.02), side + rng.uniform(-0.015, 0.015))
            a = (rng.uniform(0.25, 0.29), rng.uniform(0.12, 0.14))
            inside = ((rr - c[0]) / a[0]) ** 2 + ((cc - c[1]) / a[1]) ** 2 <= 1.0
            m[inside] = rng.uniform(720, 880)
            lung_mask |= inside
            lungs.append((c, a))
        m += lung_mask * (
            70.0 * findings.correlated_texture(rng, shape, 1.5)
            + findings.vessels(rng, shape, int(rng.integers(4, 8)), 2.0, 420.0)
        )
        k = np.ones(3) / 3
        m = np.apply_along_axis(lambda v: np.convolve(v, k, mode="same"), 0, m)
        m = np.apply_along_axis(lambda v: np.convolve(v, k, mode="same"), 1, m)

        def spot(radius: float) -> tuple[float, float] | None:
            (cy, cx), (ay, ax) = lungs[int(rng.integers(0, 2))]
            t, rho = rng.uniform(0, 2 * np.pi), np.sqrt(rng.uniform(0, 1))
            ey, ex = ay * size - radius - 2, ax * size - radius - 2
            if ey <= 0 or ex <= 0:
                return None
            return (cy * size + rho * ey * np.sin(t), cx * size + rho * ex * np.cos(t))

        radii = [float(rng.uniform(4.0, 5.5)) for _ in kinds]
        for (cy, cx, rad), kind in zip(findings.place(rng, radii, spot, 2.0), kinds, strict=False):
            m += findings.finding(
                shape,
                (cy, cx),
                rad,
                float(thetas[kind]),
                period,
                float(rng.uniform(550, 750)),
                float(rng.uniform(*modulation)),
                float(rng.uniform(0, 2 * np.pi)),
            )
        return np.clip(m + rng.normal(0, noise, m.shape), 0, FULL_SCALE)

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        noise = uniform(rng, rg["noise"])
        size = int(rng.integers(int(rg["image_px"][0]), int(rg["image_px"][1]) + 1))
        n = int(rng.integers(12, 17)) if split == "train" else int(rng.integers(16, 21))
        ids = case_ids(rng, "cxr", n)
        pos = int(rng.integers(n // 2 - 1, n // 2 + 2))
        labels = np.array([1] * pos + [0] * (n - pos))
        rng.shuffle(labels)
        thetas = findings.orientations(rng)
        period = uniform(rng, (3.8, 4.6))
        modulation = _MODULATION[tier]
        mono1 = rng.random(n) < 0.5
        # Keep the trap live in both classes: MONOCHROME1 normals and opacities.
        for cls, least in ((0, 2), (1, 1)):
            members = np.nonzero(labels == cls)[0]
            short = least - int(mono1[members].sum())
            if short > 0:
                mono1[rng.choice(members[~mono1[members]], size=short, replace=False)] = True
        files = {}
        for k, cid in enumerate(ids):
            # Three findings of distinct types per image: the opacity and two look-alikes,
            # or three look-alikes. Every type is then present in half the images.
            looks = rng.permutation(np.arange(1, findings.TYPES))
            kinds = [0, *looks[:2]] if labels[k] else list(looks[:3])
            m = self._image(rng, size, noise, rng.permutation(kinds), thetas, period, modulation)
            slope, inter = _RESCALES[int(rng.integers(0, len(_RESCALES)))]
            value = FULL_SCALE - m if mono1[k] else m
            stored = np.rint((value - inter) / slope)
            files[f"data/images/{cid}.dcm"] = dicom_bytes(
                stored,
                uid_parts=("medbench_lite", self.name, split, seed, cid),
                photometric="MONOCHROME1" if mono1[k] else "MONOCHROME2",
                slope=slope,
                intercept=inter,
                pixel_spacing=(round(430.0 / size, 3), round(430.0 / size, 3)),
                modality="DX",
                patient_id=cid.upper(),
                study_date=f"2024{1 + k % 12:02d}{1 + (seed + k) % 28:02d}",
                extra={"BodyPartExamined": "CHEST", "ViewPosition": "PA"},
            )
        task_json = {
            "inputs": {"format": "DICOM", "dir": "data/images", "pattern": "{id}.dcm"},
            "output": {
                "kind": "csv_labels",
                "labels": {"0": "no focal opacity", "1": "focal lung opacity"},
                "confidence": "probability of the submitted label, 0.5-1",
            },
            "submission": {"columns": ["id", "label", "confidence"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={
                "cases": n,
                "noise": noise,
                "image_px": size,
                "monochrome1": int(mono1.sum()),
                "difficulty": tier,
            },
            files=files,
            weights=self.weights(float(thetas[0]), period),
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers={"labels": {cid: int(v) for cid, v in zip(ids, labels, strict=True)}},
        )

    def score_cases(self, draw: Draw, workspace: Path, rows: Rows, ids: Sequence[str]) -> float:
        """Balanced accuracy of the submitted labels over ``ids``."""
        truth = [draw.answers["labels"][cid] for cid in ids]
        pred = [_label(rows[cid].get("label")) for cid in ids]
        return metrics.balanced_accuracy(truth, pred)

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Read every data/images/<id>.dcm with pydicom and record PhotometricInterpretation and "
                "RescaleSlope/RescaleIntercept. The model card wants modality values (apply_modality_lut) "
                "in MONOCHROME2 sense, 0..4095: MONOCHROME1 files are inverted with 4095 - value.",
                "pipeline/infer.py calls infer_lib.classify(values, W) per image. Validate on one "
                "MONOCHROME1 file with a rescale: lungs must be darker than the mediastinum and the ROI "
                "mean within the card's 500-1300.",
                "Confidence = max(p, 1 - p). Write outputs/predictions.csv, then outputs/submission.csv "
                "(id,label,confidence) in task.json order with integer labels, each with a receipt.",
            ),
            out_dir="outputs",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, reading every DICOM header (photometric "
                "interpretation, rescale), then pinning and smoke-testing the model.",
                "pipeline": "Some files are MONOCHROME1 and most are rescaled, so the pipeline applies the "
                "modality LUT and inverts MONOCHROME1 to the model's MONOCHROME2 convention.",
                "pipeline_bug": "Writing the pipeline: read each DICOM, apply the rescale, classify.",
                "pilot": "Pilot on the riskiest file (MONOCHROME1 with a rescale), checking the model's "
                "input against the anatomy the card describes.",
                "bug_seen": "The pilot's lungs come out brighter than the mediastinum: this MONOCHROME1 "
                "file stores inverted values, and the pipeline fed them to the model as they are.",
                "fix": "Inverting MONOCHROME1 files (4095 - value) after the rescale, then rerunning the "
                "pilot.",
            },
        )
