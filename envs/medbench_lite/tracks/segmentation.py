"""Segmentation track: liver and liver lesions in abdominal CT volumes (NIfTI).

Each case is a CT volume with a spine, a spleen, noise, anisotropic voxels and an
affine with an origin offset. The right upper quadrant is one soft-tissue mass cut
into ``ORGANS`` abutting organs of the same density and noise, the liver and its
look-alikes (bowel, kidney), in shuffled roles: no threshold, side prior, size or
opening separates them. Each organ carries stripes of its own orientation (``180 /
ORGANS`` degrees apart, one period per task). Focal hypodense findings of six stripe
orientations (:mod:`~bat_gym.envs.medbench_lite.tracks.findings`), equally many of each
per task, lie in the organs: type 0, the lesion, always in the liver; the look-alikes
(cysts, vessels) in any organ, so that every organ holds as many foci on average. The
provided model's weights hold the liver's and the lesion's orientation and period, so
only the model tells the liver from its neighbours and lesions from look-alikes.
(Known limit: lesions never leave the liver, so a reader who clustered every focus's
texture and every organ's across a task could look for the one focus type seen in a
single organ texture; with two lesions per task that evidence is thin.)
Most volumes are stored in a voxel order other than RAS+ (LPS, LAS, PLS, LPI).

TRAP (orientation): the model keeps only the patient's-right half of axis 0 and reads
its textures on the RAS+ grid. Run on the stored array, it looks at the left half (or
the back) and at turned stripes, and labels little or the wrong organ.
``nib.as_closest_canonical`` before the model, and mapping the labels back onto the
input's grid and affine, fixes it. A pilot that checks the liver's side in world
coordinates and its volume catches it.
Tiers (:func:`~bat_gym.envs.medbench_lite.tracks.base.difficulty`): on the hard tier
the stripes are fainter and the foci 25-35 HU darker than the parenchyma instead of
45-60 HU (the model misses or clips some lesions). Every task has at least one lesion.
Metric: 0.5 x the mean over cases of the liver Dice (labels 1+2) + 0.5 x the lesion
Dice (label 2) pooled over the cases' voxels (LiTS's "Dice global"): an empty lesion
mask earns nothing, and a lesion predicted on a lesion-free case costs precision.
When the scored cases hold no lesion and none is predicted (a one-case pilot), the
score is the liver term alone. A mask that is missing, off the input grid, or holds a
value that does not round to 0, 1 or 2 (nan, inf, 1e300) is empty for that case.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import nifti_bytes
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
    read_output_volume,
    resolve_output,
    uniform,
)

__all__ = ["Segmentation"]

_ORIENTS = ("LPS", "LAS", "PLS", "LPI", "RAS")
_ORIENT_P = (0.35, 0.2, 0.15, 0.2, 0.1)
_FOV_XY_MM, _FOV_Z_MM = 330.0, 190.0
# The right upper quadrant is one soft-tissue mass split into ORGANS abutting organs
# of the same density and noise: index 0 is the liver, the others its look-alikes
# (bowel, kidney); each has stripes at its own orientation, 180 / ORGANS degrees apart.
ORGANS = 3
# Per tier: stripe amplitude (HU) of the parenchyma and of the focal findings, and how
# much darker (HU) than the parenchyma the findings are. Hard: fainter and closer.
_TIERS = {
    "easy": {"tissue_hu": (14.0, 18.0), "finding_hu": (14.0, 18.0), "contrast": (45.0, 60.0)},
    "hard": {"tissue_hu": (11.0, 14.0), "finding_hu": (10.0, 13.0), "contrast": (25.0, 35.0)},
}

MODEL_CARD = """# Model card: liver-lesion-texture v2.0

Labels the liver (1) and hypodense liver lesions (2) on contrast-free abdominal CT.
Organs next to the liver share its density; the model tells them apart by the
liver's parenchymal texture, and lesions from look-alike foci (cysts, vessels) by
the lesions' texture, both held in its weights as stripe orientation and period on
the RAS+ voxel grid. Parameters: model/weights.npz. Code: model/infer_lib.py (numpy).

## Input convention
- `volume_hu`: float array in Hounsfield units (nibabel `get_fdata()` applies the
  NIfTI scaling).
- Voxel axes in **RAS+ order**: axis 0 runs from the patient's left to the patient's
  Right, axis 1 to Anterior, axis 2 to Superior (what `nibabel.as_closest_canonical`
  returns). The model only looks at the high half of axis 0, the patient's right,
  and reads textures on that grid; in any other voxel order it labels the wrong
  tissue or none.
- `spacing_mm`: voxel sizes in mm, in the same axis order.

## Output
uint8 labels in the input's voxel order. Volumes given to the model in a reoriented
order must have their labels mapped back to the file's own orientation: masks are
scored on the input file's voxel grid and affine.

## Expected behaviour
Liver 0.4-1.5 L, on the patient's right. Lesions 0-2, 2-4.5 cm, darker than the liver.

## Usage
    W = infer_lib.load("model/weights.npz")
    labels = infer_lib.segment(volume_hu, spacing_mm, W)
"""

TASK_MD = """Segment the liver and liver lesions in every CT volume of `data/images/`
(`<id>.nii.gz`, NIfTI-1; the case ids are in task.json).

Output per case: `outputs/masks/<id>.nii.gz`, a uint8 label volume (0 background,
1 liver, 2 lesion) with **the same shape and affine as the input volume**.
Submission: `outputs/submission.csv` with columns `id,mask_file,liver_ml,lesion_ml`,
one row per case id; `mask_file` is the mask's path relative to the workspace.
Metric: 0.5 x mean over cases of the liver Dice + 0.5 x the lesion Dice pooled over
all cases' voxels (an empty lesion mask earns nothing; a lesion predicted where there
is none costs precision). A missing case scores the task 0.
"""


def _ellipsoid(
    x: np.ndarray, y: np.ndarray, z: np.ndarray, c: np.ndarray, r: np.ndarray
) -> np.ndarray:
    return ((x - c[0]) / r[0]) ** 2 + ((y - c[1]) / r[1]) ** 2 + ((z - c[2]) / r[2]) ** 2 <= 1.0


class Segmentation(TrackBase):
    """Liver and lesion segmentation on CT volumes stored in mixed orientations."""

    name = "segmentation"
    metric = "dice"
    description = "Segment the liver and liver lesions in CT volumes (NIfTI)."
    index = 0
    ranges = {
        "train": {"noise_hu": (8.0, 14.0), "spacing_xy_mm": (5.0, 5.8), "thickness_mm": (5.0, 6.0)},
        "heldout": {
            "noise_hu": (16.0, 22.0),
            "spacing_xy_mm": (4.4, 4.9),
            "thickness_mm": (4.0, 4.8),
        },
    }

    def weights(
        self, liver_theta: float = 0.0, lesion_theta: float = 0.0, period: float = 4.0
    ) -> dict[str, np.ndarray]:
        """The model's parameters: thresholds plus the liver's and the lesions' stripe texture.

        ``liver_theta`` and ``lesion_theta`` are stripe-normal angles (radians from axis 0
        towards axis 1 of the RAS+ grid) and ``period`` the stripe period in voxels.
        """
        return {
            "tissue_hu": np.array([-15.0, 200.0]),
            "parenchyma_hu": np.array(35.0),
            "smooth": np.array(3),
            "bone_margin": np.array(1),
            "liver_texture": np.array([liver_theta, period]),
            "lesion_texture": np.array([lesion_theta, period]),
            "texture_window": np.array([5, 5, 3]),
            "texture_floor": np.array(0.25),
            "enclose_mm": np.array(40.0),
            "enclose_sides": np.array(4),
            "lesion_margin_hu": np.array(12.0),
            "lesion_min_voxels": np.array(20),
            "lesion_tolerance": np.array(np.pi / 12),
            "lesion_snr": np.array(2.0),
            "lesion_grow": np.array(1),
        }

    def _case(
        self,
        rng: np.random.Generator,
        sxy: float,
        sz: float,
        noise: float,
        code: str,
        tier: dict,
        organ_thetas: np.ndarray,
        finding_thetas: np.ndarray,
        period: float,
        kinds: Sequence[tuple[int, int]],
    ) -> dict:
        """One volume: ``kinds`` lists the focal findings as ``(type, host organ)`` pairs.

        Type 0 is the lesion (always hosted by the liver, organ 0); types 1.. are its
        look-alikes, labelled as their host organ.
        """
        from nibabel.orientations import (
            apply_orientation,
            axcodes2ornt,
            inv_ornt_aff,
            ornt_transform,
        )

        n = int(np.ceil(_FOV_XY_MM / sxy))
        nz = int(np.ceil(_FOV_Z_MM / sz))
        ax = (np.arange(n) - (n - 1) / 2) * sxy
        az = (np.arange(nz) - (nz - 1) / 2) * sz
        x, y, z = np.meshgrid(ax, ax, az, indexing="ij")
        ix, iy = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        ix, iy = ix[..., None].astype(np.float64), iy[..., None].astype(np.float64)

        def stripes(theta: float, amp: float) -> np.ndarray:
            u = ix * np.cos(theta) + iy * np.sin(theta)
            return amp * np.cos(2 * np.pi * u / period + rng.uniform(0, 2 * np.pi))

        hu = np.full(x.shape, -1000.0)
        body = (x / rng.uniform(140, 155)) ** 2 + (y / rng.uniform(100, 110)) ** 2 <= 1.0
        hu[body] = -90.0
        spine = (x**2 + (y + 75.0) ** 2) <= 18.0**2
        hu[spine] = 450.0
        organ_hu = rng.uniform(57, 67)
        amp = uniform(rng, tier["tissue_hu"])
        spleen_c = np.array([rng.uniform(-86, -74), rng.uniform(-41, -29), rng.uniform(2, 18)])
        spleen_r = np.array([rng.uniform(24, 32), rng.uniform(35, 45), rng.uniform(35, 45)])
        spleen = _ellipsoid(x, y, z, spleen_c, spleen_r)
        # The spleen's stripes run at an orientation of their own, so the left side
        # rules out none of the right-sided organs' textures.
        hu = np.where(spleen, organ_hu + stripes(rng.uniform(0, np.pi), amp), hu)
        # The mass: one ellipsoid on the right, cut into ORGANS cells around seeds at
        # equal angles from a random start, roles shuffled, so a cell's position or
        # size says nothing of which organ it is.
        mass_c = np.array([rng.uniform(60, 70), rng.uniform(-6, 6), rng.uniform(-6, 6)])
        mass_r = np.array([rng.uniform(70, 78), rng.uniform(86, 94), rng.uniform(78, 86)])
        mass = _ellipsoid(x, y, z, mass_c, mass_r) & body
        # Fat planes around the spine and along the midline: the mass is all right-sided.
        mass &= ((x**2 + (y + 75.0) ** 2) > 26.0**2) & (x > 6.0)
        a0 = rng.uniform(0, 2 * np.pi)
        angles = a0 + 2 * np.pi * np.arange(ORGANS) / ORGANS
        seeds = mass_c + 0.5 * mass_r * np.stack(
            [np.cos(angles), np.sin(angles), rng.uniform(-0.4, 0.4, ORGANS)], axis=1
        )
        dist = np.stack(
            [((x - s[0]) ** 2 + (y - s[1]) ** 2 + (z - s[2]) ** 2) for s in seeds], axis=0
        )
        cell = np.argmin(dist, axis=0)
        roles = rng.permutation(ORGANS)  # roles[k]: the organ type of cell k
        organ = np.where(mass, roles[cell], -1)
        for k in range(ORGANS):
            hu = np.where(organ == k, organ_hu + stripes(float(organ_thetas[k]), amp), hu)
        labels = np.zeros(x.shape, dtype=np.uint8)
        labels[organ == 0] = 1
        # Focal findings: spheres inside their host organ, 4 mm or more from its edge.
        placed: list[tuple[np.ndarray, float]] = []
        dirs = np.array(
            [[i, j, k] for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1) if i or j or k],
            dtype=np.float64,
        )
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        grid_min = np.array([ax[0], ax[0], az[0]])
        steps = np.array([sxy, sxy, sz])
        lesions = 0
        for ftype, host in kinds:
            where = np.argwhere(organ == host)
            if where.size == 0:
                continue
            for _try in range(400):
                # Smaller spheres after many misses: a thin organ still hosts its share.
                r = float(rng.uniform(15, 22)) * (1.0 if _try < 200 else 0.75)
                c = grid_min + where[rng.integers(len(where))] * steps
                probe = np.rint((c + (r + 4.0) * dirs - grid_min) / steps).astype(int)
                if np.any(probe < 0) or np.any(probe >= np.array(x.shape)):
                    continue
                if not np.all(organ[probe[:, 0], probe[:, 1], probe[:, 2]] == host):
                    continue
                if all(np.linalg.norm(c - c2) > r + r2 + 6 for c2, r2 in placed):
                    placed.append((c, r))
                    ball = ((x - c[0]) ** 2 + (y - c[1]) ** 2 + (z - c[2]) ** 2) <= r * r
                    hu = np.where(
                        ball,
                        organ_hu
                        - uniform(rng, tier["contrast"])
                        + stripes(float(finding_thetas[ftype]), uniform(rng, tier["finding_hu"])),
                        hu,
                    )
                    if ftype == 0:
                        labels[ball] = 2
                        lesions += 1
                    break
        hu = hu + rng.normal(0, noise, size=hu.shape) * body
        origin = rng.uniform(-40, 40, size=3) - np.array(
            [(n - 1) / 2 * sxy, (n - 1) / 2 * sxy, (nz - 1) / 2 * sz]
        )
        can_aff = np.diag([sxy, sxy, sz, 1.0])
        can_aff[:3, 3] = origin
        t = ornt_transform(axcodes2ornt(tuple("RAS")), axcodes2ornt(tuple(code)))
        native_aff = can_aff @ inv_ornt_aff(t, hu.shape)
        stored = apply_orientation(np.clip(np.rint(hu), -1024, 3071).astype(np.int16), t)
        return {
            "stored": np.ascontiguousarray(stored),
            "labels": np.ascontiguousarray(apply_orientation(labels, t)).astype(np.uint8),
            "affine": native_aff,
            "code": code,
            "lesions": lesions,
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        noise = uniform(rng, rg["noise_hu"])
        sxy = uniform(rng, rg["spacing_xy_mm"])
        sz = uniform(rng, rg["thickness_mm"])
        n = int(rng.integers(3, 5))
        ids = case_ids(rng, "ct", n)
        codes = [str(c) for c in rng.choice(_ORIENTS, size=n, p=_ORIENT_P)]
        if all(c[0] == "R" for c in codes):
            codes[0] = "LPS"  # keep the trap live: at least one volume not in RAS+ order
        t0 = rng.uniform(0.0, np.pi)
        organ_thetas = (t0 + np.arange(ORGANS) * np.pi / ORGANS) % np.pi
        finding_thetas = findings.orientations(rng)
        period = uniform(rng, (3.6, 4.4))
        # Every finding type equally often in the task; a lesion (type 0) lies in the
        # liver, a look-alike in the liver with probability 1 / (2 ORGANS - 2) and else
        # in another organ, so every organ hosts as many findings on average.
        types = findings.balanced_types(rng, 2)
        p_liver = 1.0 / (2 * ORGANS - 2)
        p_host = np.array([p_liver] + [(1 - p_liver) / (ORGANS - 1)] * (ORGANS - 1))
        hosts = [0 if t == 0 else int(rng.choice(ORGANS, p=p_host)) for t in types]
        where = rng.integers(0, n, size=types.size)
        cases: list[dict] = []
        for k, code in enumerate(codes):
            kinds = [(int(t), h) for t, h, w in zip(types, hosts, where, strict=True) if w == k]
            cases.append(
                self._case(
                    rng,
                    sxy,
                    sz,
                    noise,
                    code,
                    _TIERS[tier],
                    organ_thetas,
                    finding_thetas,
                    period,
                    kinds,
                )
            )
        files = {
            f"data/images/{cid}.nii.gz": nifti_bytes(
                c["stored"], c["affine"], descrip="MedBench-Lite abdominal CT"
            )
            for cid, c in zip(ids, cases, strict=True)
        }
        task_json = {
            "inputs": {
                "format": "NIfTI-1",
                "dir": "data/images",
                "pattern": "{id}.nii.gz",
                "units": "HU",
            },
            "output": {
                "kind": "nifti_label_mask",
                "dir": "outputs/masks",
                "pattern": "{id}.nii.gz",
                "dtype": "uint8",
                "labels": {"0": "background", "1": "liver", "2": "lesion"},
                "grid": "same shape and affine as the input volume",
            },
            "submission": {
                "columns": ["id", "mask_file", "liver_ml", "lesion_ml"],
                "case_ids": list(ids),
            },
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
            weights=self.weights(float(organ_thetas[0]), float(finding_thetas[0]), period),
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            answers={
                "labels": {cid: c["labels"] for cid, c in zip(ids, cases, strict=True)},
                "affines": {cid: c["affine"] for cid, c in zip(ids, cases, strict=True)},
            },
        )

    def score_cases(self, draw: Draw, workspace: Path, rows: Rows, ids: Sequence[str]) -> float:
        """Mean liver Dice, averaged with the lesion Dice pooled over ``ids`` when any."""
        liver_dice = []
        inter = total = 0
        for cid in ids:
            truth = draw.answers["labels"][cid]
            path = resolve_output(workspace, rows[cid].get("mask_file", ""))
            out = read_output_volume(path, truth.shape, draw.answers["affines"][cid])
            with np.errstate(invalid="ignore"):
                # Labels round to {0, 1, 2} or the mask is unusable (nan, inf, 1e300 ...).
                lab = None if out is None else np.rint(out)
                usable = lab is not None and bool(np.all(np.isin(lab, (0.0, 1.0, 2.0))))
            pred = lab.astype(np.int64) if usable else np.zeros(truth.shape, dtype=np.int64)
            liver_dice.append(metrics.dice(pred > 0, truth > 0) if usable else 0.0)
            inter += int(np.logical_and(pred == 2, truth == 2).sum())
            total += int((pred == 2).sum()) + int((truth == 2).sum())
        liver = float(np.mean(liver_dice))
        if total == 0:
            return liver  # no lesion in these cases and none predicted: liver only
        return 0.5 * liver + 0.5 * (2.0 * inter / total)

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Open every data/images/<id>.nii.gz with nibabel; record shape, voxel spacing and "
                "orientation (aff2axcodes). The model card wants HU in RAS+ voxel order, so reorient "
                "each volume with nib.as_closest_canonical and keep the original affine.",
                "pipeline/infer.py calls infer_lib.segment(volume_hu, spacing_mm, W) on the canonical "
                "volume. Validate on one non-RAS+ case first: the liver must be on the patient's right "
                "(world +x in RAS) with a 0.4-1.5 L volume, and the mask must sit on the input grid.",
                "Map the labels back to each file's own orientation, save outputs/masks/<id>.nii.gz as "
                "uint8 with the input affine, write outputs/predictions.csv, then outputs/submission.csv "
                "(id,mask_file,liver_ml,lesion_ml) in task.json order, each with a receipt.",
            ),
            out_dir="outputs/masks",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, opening every volume to see its orientation and "
                "spacing, then pinning and smoke-testing the model.",
                "pipeline": "Some volumes are not stored in RAS+ order and the model card requires it, so the "
                "pipeline reorients each volume for the model and maps the labels back onto the input's "
                "own grid and affine.",
                "pipeline_bug": "Writing the pipeline: load each volume, run the model, save the mask with "
                "the input's affine.",
                "pilot": "Pilot on one case stored in a non-RAS+ order, the riskiest one; the check is "
                "anatomical: the liver must lie on the patient's right with a plausible volume.",
                "bug_seen": "The pilot's 'liver' is missing, off the patient's right or of an implausible "
                "volume: the model saw the stored axis order, not RAS+, so its right-side prior and its "
                "texture filters looked at the wrong tissue.",
                "fix": "Reorienting each volume to RAS+ for the model and mapping the labels back, then "
                "rerunning the pilot.",
            },
        )
