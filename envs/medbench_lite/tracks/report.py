"""Report track: structured CT chest reports of pulmonary nodules (NIfTI + metadata).

Each case is a chest CT volume (RAS+ order, anisotropic voxels of about 3 x 3 x 5 mm)
with 0-3 nodules of known diameter and lobe, plus patient metadata. Lobes follow
oblique fissures (high at the back, low at the front) and the right horizontal fissure,
invisible on the images; the model's weights place them. Each task draws its fissures
around the textbook positions (:meth:`Report.fissures`) and its model carries them, so
a reader's fixed textbook bands misplace the nodules near a fissure. Tiers: nodules are solid
(30 HU) on the easy tier and part-solid (-430 to -200 HU) on the hard one, where the
model's fixed calibration misjudges some sizes.

TRAP (voxel spacing): the model reports sizes in the units of the ``spacing`` argument,
whose default is the 1 mm grid it was tuned on. Left at the default, every size comes
out in voxel units, about a third of the true size in mm. A pilot that measures a
nodule's width at half contrast along x in mm straight from the image and compares it
with the report catches it.
Metric: per case, 0.5 x F1 of the reported findings (matched by lobe) + 0.5 x the
fraction of true nodules reported with a size within max(2 mm, 15%)
(:func:`~bat_gym.envs.medbench_lite.metrics.finding_f1`). A report that neither lists a
finding nor says ``- No pulmonary nodules.`` scores 0, on a normal study too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import nifti_bytes
from bat_gym.envs.medbench_lite.scripts import recipe_scripts
from bat_gym.envs.medbench_lite.teacher import Recipe
from bat_gym.envs.medbench_lite.tracks.base import (
    Draw,
    Split,
    TrackBase,
    case_ids,
    difficulty,
    resolve_output,
    uniform,
)

__all__ = ["Report", "parse_report"]

_FOV_XY_MM, _FOV_Z_MM = 300.0, 250.0
_LUNG = {"right": (75.0, 5.0, 0.0), "left": (-75.0, 5.0, 0.0)}  # centre (x, y, z) in mm, RAS
_LUNG_R = (52.0, 68.0, 105.0)
_LOBES = (
    "right upper lobe",
    "right middle lobe",
    "right lower lobe",
    "left upper lobe",
    "left lower lobe",
)
_FINDING = re.compile(
    r"^\s*-\s*nodule:\s*(right|left)\s+(upper|middle|lower)\s+lobe\s*,\s*([0-9]+(?:\.[0-9]+)?)\s*mm",
    re.I,
)
_INDICATIONS = (
    "follow-up of a known nodule",
    "cough, weight loss",
    "staging",
    "screening, former smoker",
    "dyspnoea",
)

MODEL_CARD = """# Model card: nodule-report v2.1

Finds solid pulmonary nodules on chest CT and writes a structured report.
Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).

## Input convention
- `volume_hu`: float array in Hounsfield units, voxel axes in RAS+ order.
- `spacing`: voxel size along the three axes. **Sizes are reported in the units of
  `spacing`**; the default (1, 1, 1) is the 1 mm isotropic grid the model was tuned
  on. For any other grid pass the voxel size in mm (NIfTI header zooms).

## Output
`find_nodules(volume_hu, W, spacing)` -> `{"center_vox", "diameter_mm", "lobe"}`
per nodule (equivalent-sphere diameter). `format_report(case_id, findings,
metadata)` -> the report text in the format task.json asks for.

## Lobes
The oblique fissures (weights `right_fissures`, `left_fissure`) are planes in the lung's
normalized height and depth; the right horizontal fissure splits upper from middle.
They are calibrated on this site's population and differ from textbook positions.

## Expected behaviour
Solid nodules 10-30 mm. A nodule's extent across its centre along x, in mm, is close
to its reported diameter.

## Usage
    W = infer_lib.load("model/weights.npz")
    findings = infer_lib.find_nodules(volume_hu, W, spacing=zooms_mm)
"""

TASK_MD = """Write a structured report for every chest CT in `data/images/` (`<id>.nii.gz`,
NIfTI-1, RAS+; case ids in task.json); patient metadata is in `data/metadata.json`.

Output per case: `outputs/reports/<id>.txt` with a `FINDINGS:` section holding one line
per nodule, exactly `- Nodule: <side> <upper|middle|lower> lobe, <diameter> mm.` (side
left/right, diameter in mm), or `- No pulmonary nodules.` Submission:
`outputs/submission.csv` with columns `id,report_file,n_findings`, one row per case id.
Metric: 0.5 x F1 of the findings (matched by lobe) + 0.5 x the fraction of nodules
whose size is within max(2 mm, 15%). A report that lists no nodule and does not say
`- No pulmonary nodules.` scores 0. A missing case scores the task 0.
"""

_NO_FINDINGS = re.compile(r"^\s*-\s*no pulmonary nodules\b", re.I)


def parse_report(text: str) -> list[tuple[str, float]] | None:
    """The ``(lobe, diameter_mm)`` findings in a report's text, or None if it states none.

    A report states its findings with ``- Nodule: ...`` lines or says
    ``- No pulmonary nodules.``; one that does neither (empty, truncated, another
    format) is unparseable and returns None, so it cannot pass for a normal study.
    A diameter too large for a float reads as ``inf`` and is never right.
    """
    out = []
    negative = False
    for line in text.splitlines():
        m = _FINDING.match(line)
        if m:
            out.append((f"{m.group(1).lower()} {m.group(2).lower()} lobe", float(m.group(3))))
        elif _NO_FINDINGS.match(line):
            negative = True
    if not out and not negative:
        return None
    return out


# Fissures in lung-normalized coordinates: zf (0 at the lung's base, 1 at its apex) and
# yf (-1 posterior, +1 anterior). The oblique fissures run from high at the back to low
# at the front; the right lung's horizontal fissure splits upper from middle lobe.
# These are the textbook positions, the centre of what a task draws: fissures vary
# between patient populations, and each task's model is calibrated on its own
# (:meth:`Report.fissures`), so a fixed textbook band misplaces nodules near them.
_OBLIQUE = {"right": (0.45, -0.8), "left": (0.52, -0.8)}
_HORIZONTAL = 0.64
# The largest move of a task's fissures from the textbook values: the oblique fissure's
# height (a, in zf) and slope (b, zf per yf), and the horizontal fissure's height.
_SPREAD = {"a": 0.25, "b": 0.5, "horizontal": 0.15}
# Share of perifissural nodules, and the distance (in zf) of a nodule's centre to the
# nearest fissure: at least the first (every nodule), at most the second (perifissural).
_PERIFISSURAL = 0.75
_MARGIN = (0.05, 0.12)
# Hard tier: part-solid nodules' density (HU), which the model's fixed calibration
# (solid nodules) sizes too small, the faintest ones by a fifth or more.
_PART_SOLID_HU = (-430.0, -200.0)

Fissures = dict[str, tuple[float, ...]]
TEXTBOOK: Fissures = {"right": (*_OBLIQUE["right"], _HORIZONTAL), "left": _OBLIQUE["left"]}


def _lobe_of(c: np.ndarray, side: str, fissures: Fissures = TEXTBOOK) -> tuple[str, float]:
    """A point's lobe under the given fissures, and its distance to the nearest one.

    Args:
        c: the point ``(x, y, z)`` in mm (RAS).
        side: ``right`` or ``left``.
        fissures: ``{"right": (a, b, horizontal), "left": (a, b)}``; the oblique
            fissure is ``zf = a + b * yf``.

    Returns:
        The lobe's name and the distance, in normalized height ``zf``, to the nearest
        fissure.
    """
    cx, cy, cz = _LUNG[side]
    zf = (c[2] - (cz - _LUNG_R[2])) / (2 * _LUNG_R[2])
    yf = (c[1] - cy) / _LUNG_R[1]
    a, b = fissures[side][:2]
    oblique = zf - (a + b * yf)  # above the oblique fissure: upper (or middle) lobe
    if side == "left":
        return ("left upper lobe" if oblique > 0 else "left lower lobe"), abs(oblique)
    horizontal = fissures["right"][2]
    if oblique <= 0:
        return "right lower lobe", -oblique
    if zf > horizontal:
        return "right upper lobe", min(oblique, zf - horizontal)
    return "right middle lobe", min(oblique, horizontal - zf)


class Report(TrackBase):
    """Structured nodule reports with a voxel-spacing trap."""

    name = "report"
    metric = "finding_f1_size"
    description = "Write structured CT chest reports of pulmonary nodules (NIfTI + metadata)."
    index = 6
    ranges = {
        "train": {
            "noise_hu": (12.0, 22.0),
            "spacing_xy_mm": (3.0, 3.4),
            "thickness_mm": (4.0, 5.0),
        },
        "heldout": {
            "noise_hu": (26.0, 34.0),
            "spacing_xy_mm": (3.6, 4.0),
            "thickness_mm": (5.5, 6.5),
        },
    }

    def fissures(self, seed: int, split: Split) -> Fissures:
        """The task's fissures: each textbook value moved by 50-100% of its spread.

        Each value moves up or down at random by at least half its ``_SPREAD``, so no
        task's fissures are the textbook's (the site's population differs from the
        textbook, and the model is calibrated on the site). A stream of its own, not
        the task generator's, so the rest of a draw does not depend on it.
        """
        rng = np.random.default_rng([seed, self.index, 0 if split == "train" else 1, 1])

        def moved(value: float, spread: float) -> float:
            shift = float(rng.choice([-1.0, 1.0])) * float(rng.uniform(0.5, 1.0)) * spread
            return round(value + shift, 4)

        out: Fissures = {}
        for side in ("right", "left"):
            a, b = _OBLIQUE[side]
            out[side] = (moved(a, _SPREAD["a"]), moved(b, _SPREAD["b"]))
        out["right"] = (*out["right"], moved(_HORIZONTAL, _SPREAD["horizontal"]))
        return out

    def weights(self, fissures: Fissures = TEXTBOOK) -> dict[str, np.ndarray]:
        """The task's model: detection and sizing (fixed) and the task's fissures."""
        return {
            "lung_below_hu": np.array(-500.0),
            "nodule_above_hu": np.array(-450.0),
            "reach_vox": np.array(15),
            "min_voxels": np.array(2),
            "calibration_hu": np.array([-850.0, 30.0]),
            "right_fissures": np.array(fissures["right"]),
            "left_fissure": np.array(fissures["left"]),
        }

    def _case(
        self,
        rng: np.random.Generator,
        sxy: float,
        sz: float,
        noise: float,
        count: int,
        density_hu: tuple[float, float] = (30.0, 30.0),
        fissures: Fissures = TEXTBOOK,
    ) -> dict:
        n, nz = int(np.ceil(_FOV_XY_MM / sxy)), int(np.ceil(_FOV_Z_MM / sz))
        ax = (np.arange(n) - (n - 1) / 2) * sxy
        az = (np.arange(nz) - (nz - 1) / 2) * sz
        x, y = np.meshgrid(ax, ax, indexing="ij")
        hu2d = np.full((n, n), -1000.0)
        hu2d[(x / 140.0) ** 2 + (y / 100.0) ** 2 <= 1] = 40.0
        hu2d[x**2 + (y + 80.0) ** 2 <= 15.0**2] = 400.0
        hu = np.repeat(hu2d[:, :, None], nz, axis=2)
        X, Y, Z = np.meshgrid(ax, ax, az, indexing="ij")
        lungs = np.zeros(hu.shape, dtype=bool)
        for cx, cy, cz in _LUNG.values():
            lungs |= ((X - cx) / _LUNG_R[0]) ** 2 + ((Y - cy) / _LUNG_R[1]) ** 2 + (
                (Z - cz) / _LUNG_R[2]
            ) ** 2 <= 1
        hu[lungs] = -850.0
        nodules: list[dict] = []
        for _ in range(count):
            # Most nodules are perifissural (close to a fissure, as is common on chest
            # CT), so their lobe depends on where this task's fissures run.
            perifissural = rng.random() < _PERIFISSURAL
            for _try in range(300):
                side = ("right", "left")[int(rng.integers(0, 2))]
                d = float(rng.uniform(10, 24))
                r = d / 2
                u = rng.normal(size=3)
                u *= rng.uniform(0, 1) ** (1 / 3) / np.linalg.norm(u)
                c = np.array(_LUNG[side]) + u * (np.array(_LUNG_R) - r - 8)
                lobe, margin = _lobe_of(c, side, fissures)
                if margin < _MARGIN[0] or (perifissural and margin > _MARGIN[1]):
                    continue  # clear of the fissures, so the lobe is unambiguous
                if all(np.linalg.norm(c - m["c"]) > r + m["d"] / 2 + 10 for m in nodules):
                    nodules.append(
                        {"c": c, "d": d, "lobe": lobe, "hu": float(rng.uniform(*density_hu))}
                    )
                    break
        for m in nodules:
            # Partial volume: nodule fraction per voxel from 3 x 3 x 3 sub-samples.
            r = m["d"] / 2
            sel = [
                np.nonzero(np.abs(a - m["c"][k]) <= r + s)[0]
                for k, (a, s) in enumerate(((ax, sxy), (ax, sxy), (az, sz)))
            ]
            sub = (np.arange(3) - 1) / 3
            frac = np.zeros((len(sel[0]), len(sel[1]), len(sel[2])))
            for ox in sub:
                for oy in sub:
                    for oz in sub:
                        gx, gy, gz = np.meshgrid(
                            ax[sel[0]] + ox * sxy,
                            ax[sel[1]] + oy * sxy,
                            az[sel[2]] + oz * sz,
                            indexing="ij",
                        )
                        frac += (
                            (gx - m["c"][0]) ** 2 + (gy - m["c"][1]) ** 2 + (gz - m["c"][2]) ** 2
                        ) <= r * r
            frac /= 27
            block = hu[np.ix_(*sel)]
            hu[np.ix_(*sel)] = block * (1 - frac) + m["hu"] * frac
        hu += rng.normal(0, noise, hu.shape) * (hu > -990)
        affine = np.diag([sxy, sxy, sz, 1.0])
        affine[:3, 3] = -np.array(
            [(n - 1) / 2 * sxy, (n - 1) / 2 * sxy, (nz - 1) / 2 * sz]
        ) + rng.uniform(-30, 30, 3)
        return {
            "stored": np.clip(np.rint(hu), -1024, 3071).astype(np.int16),
            "affine": affine,
            "findings": [(m["lobe"], round(m["d"], 1)) for m in nodules],
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        noise = uniform(rng, rg["noise_hu"])
        # Hard tier: part-solid nodules, less dense than soft tissue (a low-contrast case).
        density = _PART_SOLID_HU if tier == "hard" else (30.0, 30.0)
        sxy = uniform(rng, rg["spacing_xy_mm"])
        sz = uniform(rng, rg["thickness_mm"])
        n = int(rng.integers(3, 5))
        ids = case_ids(rng, "chest", n)
        # Mostly cases with findings; at most one normal study per task.
        counts = rng.choice([1, 1, 2, 2, 3], size=n)
        if rng.random() < 0.5:
            counts[int(rng.integers(0, n))] = 0
        fissures = self.fissures(seed, split)
        cases = [self._case(rng, sxy, sz, noise, int(k), density, fissures) for k in counts]
        files = {
            f"data/images/{cid}.nii.gz": nifti_bytes(
                c["stored"], c["affine"], descrip="MedBench-Lite chest CT"
            )
            for cid, c in zip(ids, cases, strict=True)
        }
        meta = {
            cid: {
                "age": int(rng.integers(45, 85)),
                "sex": ("F", "M")[int(rng.integers(0, 2))],
                "indication": _INDICATIONS[int(rng.integers(0, len(_INDICATIONS)))],
                "study_date": f"2024-{1 + int(rng.integers(0, 12)):02d}-{1 + int(rng.integers(0, 28)):02d}",
            }
            for cid in ids
        }
        files["data/metadata.json"] = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
        task_json = {
            "inputs": {
                "format": "NIfTI-1",
                "dir": "data/images",
                "pattern": "{id}.nii.gz",
                "metadata": "data/metadata.json",
            },
            "output": {
                "kind": "text_report",
                "dir": "outputs/reports",
                "pattern": "{id}.txt",
                "finding_line": "- Nodule: <right|left> <upper|middle|lower> lobe, <diameter> mm.",
                "no_finding_line": "- No pulmonary nodules.",
                "lobes": list(_LOBES),
                "size": "equivalent-sphere diameter in mm",
            },
            "submission": {"columns": ["id", "report_file", "n_findings"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={
                "difficulty": tier,
                "cases": n,
                "noise_hu": noise,
                "spacing_xy_mm": sxy,
                "thickness_mm": sz,
            },
            files=files,
            weights=self.weights(fissures),
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers={"findings": {cid: c["findings"] for cid, c in zip(ids, cases, strict=True)}},
        )

    def score_case(self, draw: Draw, workspace: Path, row: Mapping[str, str], cid: str) -> float:
        """Finding F1 and size accuracy of the case's report, weighted equally."""
        path = resolve_output(workspace, row.get("report_file", ""))
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path else None
        except OSError:
            text = None
        pred = None if text is None else parse_report(text)
        if pred is None:
            return 0.0
        f1, size_acc = metrics.finding_f1(pred, draw.answers["findings"][cid])
        return 0.5 * f1 + 0.5 * size_acc

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Load data/images/<id>.nii.gz with nibabel (RAS+, HU) and data/metadata.json; record the "
                "voxel spacing, which is anisotropic and far from the model's 1 mm default.",
                "pipeline/infer.py calls infer_lib.find_nodules(volume, W, spacing=header zooms in mm). "
                "Validate on the case with the clearest finding (fewest, densest nodules): each reported "
                "diameter must agree with the nodule's width at half contrast across its centre along x, "
                "measured in mm straight from the image.",
                "Write outputs/reports/<id>.txt with infer_lib.format_report (FINDINGS lines in task.json's "
                "format), outputs/predictions.csv, then outputs/submission.csv (id,report_file,n_findings) "
                "in task.json order, with receipts.",
            ),
            out_dir="outputs/reports",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, reading every volume's orientation and voxel spacing "
                "and the metadata, then pinning and smoke-testing the model.",
                "pipeline": "The voxels are about 3 x 3 x 5 mm and the model reports sizes in the units of "
                "its spacing argument, so the pipeline passes the header zooms in mm.",
                "pipeline_bug": "Writing the pipeline: load each volume, find the nodules, write the report "
                "with the metadata.",
                "pilot": "Pilot on the case with the clearest nodule, cross-checking each reported size "
                "against the nodule's width at half contrast measured in mm directly on the image.",
                "bug_seen": "The reported sizes are about a third of the measured extents: the model gave "
                "sizes in voxel units because no spacing was passed.",
                "fix": "Passing the voxel spacing in mm from the header zooms, then rerunning the pilot.",
            },
        )
