"""Detection track: focal lesions among look-alikes on 2D images stored as PNG or DICOM.

Each case is one grayscale image (8-bit PNG or 16-bit DICOM) on a textured background
with vessels and noise, holding bright textured disks: the task's lesions and
look-alikes of the same size and brightness whose texture runs at other orientations
(:mod:`~bat_gym.envs.medbench_lite.tracks.findings`). Every type occurs equally often
in a task, so only the provided model, whose matched filter holds the lesion texture,
tells lesions from look-alikes; a blob detector finds all of them (precision about 1/6).

Difficulty (:func:`~bat_gym.envs.medbench_lite.tracks.base.difficulty`): on the hard
tier the texture is faint (``_MODULATION``) and the model ranks some look-alikes above
lesions (mAP@0.5 about 0.8 instead of about 0.95).

TRAP (row/column versus x/y): the model returns boxes in numpy order ``(row_min,
col_min, row_max, col_max)``; the submission wants ``[x0, y0, x1, y1]`` with x the
column. Submitted as the model gives them, boxes are transposed and miss. A pilot that
checks the top-scored box, read as the scorer reads it, covers a bright blob catches it.
Metric: single-class average precision at IoU 0.5 over all images, COCO style
(:func:`~bat_gym.envs.medbench_lite.metrics.average_precision`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import dicom_bytes, png_bytes
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
    resolve_output,
    uniform,
)

__all__ = ["Detection"]

DECISION = 0.3  # matched-filter peak (image units) at score 0.5
# Texture contrast of a finding per tier: faint on the hard tier, where the model
# ranks some look-alikes above lesions.
_MODULATION = {"easy": (0.6, 0.8), "hard": (0.17, 0.32)}

MODEL_CARD = """# Model card: lesion-matched v2.0

Finds this site's focal lesions (4-7 px radius) on 2D grayscale images. Blobs are
proposed by local contrast and scored by a matched filter (`kernel`) that holds the
lesions' internal texture, so look-alikes of the same size and brightness score low.
Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).

## Input convention
- `image`: 2D float array in [0, 1] (8-bit PNG / 255; DICOM modality value / 4095).
  Integer-range arrays are scaled automatically.

## Output
A list of `{"box_rc": [row_min, col_min, row_max, col_max], "score": s}`, sorted by
score. Boxes are in **numpy (row, column) order**, half-open pixel edges: the
lesion covers `image[row_min:row_max, col_min:col_max]`. Convert to whatever box
convention your consumer expects.

## Expected behaviour
Inside a box the mean intensity is well above the image median (a lesion is at
least 0.2 brighter than its surroundings).

## Usage
    W = infer_lib.load("model/weights.npz")
    detections = infer_lib.detect(image, W)
"""

TASK_MD = """Detect the lesions in every image of `data/images/` (`<id>.png` or `<id>.dcm`; case
ids in task.json). An image may contain no lesion.

Output per case: `outputs/detections/<id>.json` = `{"id": "<id>", "boxes": [[x0, y0, x1,
y1, score], ...]}` in pixels, **x = column, y = row**, origin at the image's top-left
corner, x1 > x0 and y1 > y0. Submission: `outputs/submission.csv` with columns
`id,detections_file,n_boxes`, one row per case id.
Metric: mAP@0.5 (single class, all images pooled). A missing case scores the task 0.
"""


class Detection(TrackBase):
    """Lesion detection on PNG/DICOM images with a (row, col) vs (x, y) trap."""

    name = "detection"
    metric = "map50"
    description = "Detect focal lesions on 2D images (PNG or DICOM) with scored boxes."
    index = 2
    ranges = {
        "train": {"noise": (0.015, 0.035), "image_px": (88.0, 100.0)},
        "heldout": {"noise": (0.04, 0.055), "image_px": (112.0, 128.0)},
    }

    def weights(self, theta: float = 0.0, period: float = 4.2) -> dict[str, np.ndarray]:
        """The task's model: blob proposals and the matched filter that scores them."""
        return {
            "inner": np.array(5),
            "outer": np.array(21),
            "threshold": np.array(0.08),
            "min_area": np.array(12),
            "max_area": np.array(260),
            "pad": np.array(0.5),
            "kernel": findings.matched_kernel(theta, period, 4.0, 0.5),
            "bias": np.array(DECISION),
            "gain": np.array(25.0),
            "min_score": np.array(0.01),
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
    ) -> tuple[np.ndarray, list]:
        """One image in [0, 1] and the boxes ``[x0, y0, x1, y1]`` of its lesions (type 0).

        A smooth background with anatomical texture and vessels, then one textured disk
        per entry of ``kinds`` (:mod:`findings` types; 0 is the lesion), then noise.
        """
        shape = (size, size)
        rr, cc = np.mgrid[:size, :size] + 0.5
        x = np.full(shape, rng.uniform(0.25, 0.35))
        for _ in range(3):
            k = rng.uniform(0.5, 2.0, size=2) * 2 * np.pi / size
            x += rng.uniform(0.015, 0.04) * np.cos(
                k[0] * rr + k[1] * cc + rng.uniform(0, 2 * np.pi)
            )
        x += 0.02 * findings.correlated_texture(rng, shape, 1.5)
        x += findings.vessels(rng, shape, int(rng.integers(3, 6)), 2.0, 0.16)

        def spot(radius: float) -> tuple[float, float]:
            return tuple(rng.uniform(radius + 3, size - radius - 3, size=2))

        radii = [float(rng.uniform(4.0, 7.0)) for _ in kinds]
        boxes: list[list[float]] = []
        for (cy, cx, r), kind in zip(findings.place(rng, radii, spot, 4.0), kinds, strict=False):
            x += findings.finding(
                shape,
                (cy, cx),
                r,
                float(thetas[kind]),
                period,
                float(rng.uniform(0.3, 0.45)),
                float(rng.uniform(*modulation)),
                float(rng.uniform(0, 2 * np.pi)),
            )
            if kind == 0:
                boxes.append(
                    [round(cx - r, 2), round(cy - r, 2), round(cx + r, 2), round(cy + r, 2)]
                )
        x = np.clip(x + rng.normal(0, noise, x.shape), 0.0, 1.0)
        return x, boxes

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        noise = uniform(rng, rg["noise"])
        size = int(rng.integers(int(rg["image_px"][0]), int(rg["image_px"][1]) + 1))
        n = int(rng.integers(6, 9))
        ids = case_ids(rng, "img", n)
        thetas = findings.orientations(rng)
        period = uniform(rng, (3.8, 4.6))
        # Every type equally often in the task (the lesion among them), spread over the
        # images at random: a count, a size or a brightness says nothing of the type.
        kinds = findings.balanced_types(rng, int(rng.integers(5, 7)))
        where = np.sort(rng.integers(0, n, size=kinds.size))
        files, truths = {}, {}
        for k, cid in enumerate(ids):
            img, boxes = self._image(
                rng, size, noise, list(kinds[where == k]), thetas, period, _MODULATION[tier]
            )
            truths[cid] = boxes
            if rng.random() < 0.5:
                files[f"data/images/{cid}.png"] = png_bytes(np.rint(img * 255).astype(np.uint8))
            else:
                files[f"data/images/{cid}.dcm"] = dicom_bytes(
                    np.rint(img * 4095),
                    uid_parts=("medbench_lite", self.name, split, seed, cid),
                    modality="OT",
                    patient_id=cid.upper(),
                    study_date=f"2023{1 + k % 12:02d}{1 + (seed + k) % 28:02d}",
                )
        task_json = {
            "inputs": {
                "format": ["PNG", "DICOM"],
                "dir": "data/images",
                "pattern": "{id}.png or {id}.dcm",
            },
            "output": {
                "kind": "json_boxes",
                "dir": "outputs/detections",
                "pattern": "{id}.json",
                "schema": {"id": "<case id>", "boxes": "[[x0, y0, x1, y1, score], ...]"},
                "box_convention": "pixels; x = column, y = row; origin top-left; x1 > x0, y1 > y0",
            },
            "submission": {"columns": ["id", "detections_file", "n_boxes"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={
                "cases": n,
                "noise": noise,
                "image_px": size,
                "lesions": sum(len(b) for b in truths.values()),
                "difficulty": tier,
            },
            files=files,
            weights=self.weights(float(thetas[0]), period),
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers={"boxes": truths},
        )

    def score_cases(self, draw: Draw, workspace: Path, rows: Rows, ids: Sequence[str]) -> float:
        """mAP@0.5 of the boxes of ``ids``, pooled over the cases."""
        preds = []
        for cid in ids:
            path = resolve_output(workspace, rows[cid].get("detections_file", ""))
            try:
                data = json.loads(path.read_text()) if path else {}
                for b in data.get("boxes", []):
                    preds.append((cid, [float(v) for v in b[:4]], float(b[4])))
            except (OSError, ValueError, TypeError, IndexError, AttributeError):
                continue  # an unreadable detections file counts as no boxes
        truths = {cid: draw.answers["boxes"][cid] for cid in ids}
        return metrics.average_precision(preds, truths, 0.5)

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Read data/images/<id>.png with Pillow (/255) and <id>.dcm with pydicom "
                "(apply_modality_lut, /4095) into float images in [0, 1], as the model card asks.",
                "pipeline/infer.py calls infer_lib.detect(image, W). The model returns boxes in (row, col) "
                "order; the submission wants [x0, y0, x1, y1] with x = column. Validate on the image with "
                "the model's most confident detection: the top-scored submitted box, read as [y0:y1, "
                "x0:x1], must cover a bright lesion.",
                "Write outputs/detections/<id>.json ({id, boxes}) for every case, outputs/predictions.csv, "
                "then outputs/submission.csv (id,detections_file,n_boxes) in task.json order, with receipts.",
            ),
            out_dir="outputs/detections",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, opening every image (PNG and DICOM), then pinning "
                "and smoke-testing the model on a disk at a known row and column.",
                "pipeline": "The model card says boxes come back in (row, col) order while the submission "
                "wants x = column, so the pipeline swaps them into [x0, y0, x1, y1].",
                "pipeline_bug": "Writing the pipeline: load each image in [0, 1], detect, write the boxes "
                "with their scores.",
                "pilot": "Pilot on the image with the model's most confident detection; the check reads "
                "the top-scored box the way the scorer will and requires a bright lesion inside it.",
                "bug_seen": "The boxes, read as x = column, cover plain background: they are transposed. "
                "The model returns (row, col) and the pipeline wrote them as (x, y).",
                "fix": "Swapping to [col0, row0, col1, row1] in the pipeline, then rerunning the pilot.",
            },
        )
