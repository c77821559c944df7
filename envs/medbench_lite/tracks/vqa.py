"""VQA track: questions about rendered axial chest CT slices (PNG + JSONL).

Each test image holds four bright textured spots in its lungs, among lung texture and
vessels: the task's nodules and look-alikes (vessels seen end-on) of the same size and
brightness whose texture runs at other orientations; the types are balanced over the
task and dealt at random (:mod:`~bat_gym.envs.medbench_lite.tracks.findings`), so only
the provided model's matched filter tells nodules from look-alikes. Every test image is
asked the same three questions (how many nodules, how many in the patient's left lung,
which lung holds the largest nodule, "none" when there is none). A small dev set gives worked answers; each dev image holds
one spot of every type in one lung, so its answers do not tell which texture is the
nodule's. About 70% of the images are in radiological display convention (the
patient's right on the image left), the rest neurological; each PNG says which in a
tEXt chunk and in ``data/metadata.csv``.

No leaks: the questions asked, their number, their order (by qid), the ids, the
metadata and the spot count per image are the same whatever the answers; the test
``tests/medbench_lite/test_vqa_leaks.py`` checks that a classifier on everything but
the pixels does no better than chance.

Difficulty (:func:`~bat_gym.envs.medbench_lite.tracks.base.difficulty`): on the hard
tier the test images' texture is faint (``_MODULATION``) and the model misses some
nodules (exact match about 0.8 instead of about 0.95); worked examples stay clear.

TRAP (left/right convention): the model's side answers assume neurological display
unless told otherwise. Run with its default, every side answer and left-lung count on a
radiological image is mirrored. A pilot on a dev side question of a radiological image catches it.
Metric: exact match after normalization (case, punctuation, articles, number words).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.formats import csv_text, png_bytes
from bat_gym.envs.medbench_lite.scripts import recipe_scripts
from bat_gym.envs.medbench_lite.teacher import Recipe
from bat_gym.envs.medbench_lite.tracks import findings
from bat_gym.envs.medbench_lite.tracks.base import (
    Draw,
    Split,
    TrackBase,
    case_ids,
    difficulty,
    uniform,
)

__all__ = ["Vqa"]

Q_LEFT = "How many pulmonary nodules are in the patient's left lung?"
Q_COUNT = "How many pulmonary nodules are visible in this slice?"
Q_LARGEST = "Which lung contains the largest nodule, left or right (none if there is none)?"
QUESTIONS = (Q_COUNT, Q_LEFT, Q_LARGEST)

DECISION = 0.8  # matched-filter peak (image units) that makes a blob a nodule
_SPOTS = 4  # textured spots per test image (nodules and look-alikes together)
_RADII = (3.5, 4.5, 5.5, 6.5, 7.5)  # distinct, so "the largest" is well defined
_DEV_RADII = (3.5, 4.0, 4.5, 5.0, 5.5, 6.0)
# Texture contrast per tier: faint on the hard tier, where the model misses nodules
# and takes some look-alikes for nodules.
_MODULATION = {"easy": (0.6, 0.8), "hard": (0.27, 0.39)}

MODEL_CARD = """# Model card: chest-vqa-matched v1.0

Answers templated questions about pulmonary nodules on axial chest CT slices
(lung window). Bright blobs inside the lungs are proposed and kept as nodules when
their internal texture matches the nodules the model was trained on (matched filter
`kernel`); vessels seen end-on look alike in size and brightness but not in texture.
Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).

## Input convention
- `image`: 2D float array in [0, 1] (8-bit PNG / 255), anterior at the top.
- `convention`: how the slice is displayed. `"neurological"` (the default): the
  patient's left is on the image left. `"radiological"`: the patient's right is on
  the image left. Side answers ("left"/"right") are in **patient** terms and are
  only right when the convention matches the image.

## Output
`answer(question, nodules, width, convention)` -> "yes"/"no", a count ("0".."4"),
"left"/"right", or "none" (no nodule to place).

## Usage
    W = infer_lib.load("model/weights.npz")
    nodules = infer_lib.find_nodules(image, W)
    text = infer_lib.answer(question, nodules, image.shape[1], convention="...")
"""

TASK_MD = """Answer every question in `data/questions.jsonl` (`{"qid", "image_id", "question"}`;
the image is `data/images/<image_id>.png`, an axial chest CT slice in lung window).
Per-image acquisition metadata is in `data/metadata.csv`. Worked examples with answers:
`data/dev/questions.jsonl` (images in `data/dev/images/`).

Submission: `outputs/submission.csv` with columns `id,answer` (id = qid), one row per
question id in task.json. Answers: "yes"/"no", a digit, "left"/"right" (the
patient's side) or "none".
Metric: exact match after normalization. A missing question scores the task 0.
"""


def _render(
    rng: np.random.Generator,
    size: int,
    noise: float,
    convention: str,
    spots: list[tuple[int, float, str]],
    thetas: np.ndarray,
    period: float,
    modulation: tuple[float, float],
) -> tuple[np.ndarray, list[dict]]:
    """A lung-window slice (uint8) and its nodules (patient side, radius in px).

    ``spots`` is ``(type, radius_px, lung)`` per textured disk (:mod:`findings` type 0 is
    a nodule, the others look-alikes); a disk with no room is left out.
    """
    y, c = (np.mgrid[:size, :size] + 0.5) / size * 2 - 1
    # +p is the patient's left. Radiological display puts the patient's right on the image left.
    p = c if convention == "radiological" else -c
    img = np.full((size, size), 0.05)
    img[(p / 0.92) ** 2 + (y / 0.72) ** 2 <= 1] = 0.85
    lungs = {
        "right": (-0.42 + rng.uniform(-0.02, 0.02), -0.05, 0.33 + rng.uniform(-0.02, 0.02), 0.5),
        "left": (0.45 + rng.uniform(-0.02, 0.02), -0.05, 0.30 + rng.uniform(-0.02, 0.02), 0.48),
    }
    lung_mask = np.zeros((size, size), dtype=bool)
    for cp, cy, ap, ay in lungs.values():
        inside = ((p - cp) / ap) ** 2 + ((y - cy) / ay) ** 2 <= 1
        img[inside] = 0.2 + 0.03 * rng.standard_normal()
        lung_mask |= inside
    img[((p - 0.02) / 0.15) ** 2 + ((y + 0.3) / 0.2) ** 2 <= 1] = (
        0.9  # heart, anterior, a little to the left
    )
    img[(p**2 + (y - 0.5) ** 2) <= 0.12**2] = 1.0
    shape = (size, size)
    # Lung parenchyma: fine texture and faint vessels, below the nodule proposal level.
    img += lung_mask * (
        0.02 * findings.correlated_texture(rng, shape, 1.5)
        + findings.vessels(rng, shape, int(rng.integers(4, 8)), 1.5, 0.18)
    )
    img = metrics._box_filter(img, 3)
    nodules: list[dict] = []
    placed: list[tuple[float, float, float]] = []
    for kind, r_px, side in spots:
        cp, cy, ap, ay = lungs[side]
        for _try in range(200):
            t, rho = rng.uniform(0, 2 * np.pi), np.sqrt(rng.uniform(0, 1))
            r_n = 2 * (r_px + 4) / size  # radius plus a lung margin, in normalized units
            npc = cp + rho * max(ap - r_n, 0.01) * np.cos(t)
            nyc = cy + rho * max(ay - r_n, 0.01) * np.sin(t)
            heart = ((npc - 0.02) / 0.15) ** 2 + ((nyc + 0.3) / 0.2) ** 2 <= 1.6
            ok_gap = all(
                np.hypot(npc - q, nyc - w) * size / 2 > r_px + r2 + 4 for q, w, r2 in placed
            )
            if ok_gap and not heart:
                placed.append((float(npc), float(nyc), r_px))
                break
        else:
            continue
        # Image position of the centre: p is +c in radiological display, -c otherwise.
        col = ((npc if convention == "radiological" else -npc) + 1) / 2 * size
        row = (nyc + 1) / 2 * size
        img += findings.finding(
            shape,
            (row, col),
            r_px,
            float(thetas[kind]),
            period,
            float(rng.uniform(0.45, 0.6)),
            float(rng.uniform(*modulation)),
            float(rng.uniform(0, 2 * np.pi)),
        )
        if kind == 0:
            nodules.append({"side": side, "p": float(npc), "y": float(nyc), "r_px": r_px})
    img = np.clip(img + rng.normal(0, noise, img.shape), 0, 1)
    return np.rint(img * 255).astype(np.uint8), nodules


def _answers(nodules: list[dict]) -> dict[str, str]:
    """Every question's answer for an image; every image is asked all three."""
    big = max(nodules, key=lambda n: n["r_px"]) if nodules else None
    return {
        Q_COUNT: str(len(nodules)),
        Q_LEFT: str(sum(n["side"] == "left" for n in nodules)),
        Q_LARGEST: big["side"] if big else "none",
    }


def _spots(rng: np.random.Generator, kinds: Sequence[int]) -> list[tuple[int, float, str]]:
    """``(type, radius, lung)`` per spot: distinct radii 1 px apart, lungs at random."""
    radii = rng.permutation(_RADII)[: len(kinds)]
    return [
        (int(k), float(r), "right" if rng.random() < 0.5 else "left")
        for k, r in zip(kinds, radii, strict=True)
    ]


class Vqa(TrackBase):
    """Chest CT VQA with a display-convention (left/right) trap."""

    name = "vqa"
    metric = "exact_match"
    description = "Answer questions about axial chest CT slices (PNG) about pulmonary nodules."
    index = 5
    ranges = {
        "train": {"noise": (0.02, 0.04), "image_px": (112.0, 128.0)},
        "heldout": {"noise": (0.05, 0.07), "image_px": (136.0, 152.0)},
    }

    def weights(self, theta: float = 0.0, period: float = 4.2) -> dict[str, np.ndarray]:
        """The task's model: blob proposal thresholds and the nodule matched filter."""
        return {
            "lung_below": np.array(0.45),
            "tissue_above": np.array(0.5),
            "reach_px": np.array(24),
            "min_area": np.array(12),
            "max_area": np.array(220),
            "kernel": findings.matched_kernel(theta, period, 6.0, 0.0, taper=True),
            "bias": np.array(DECISION),
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        tier = difficulty(seed)
        noise = uniform(rng, rg["noise"])
        size = int(rng.integers(int(rg["image_px"][0]), int(rg["image_px"][1]) + 1))
        n_img = int(rng.integers(4, 7))
        image_ids = case_ids(rng, "slice", n_img + 2)
        # Which ids are worked examples is drawn, not the sorted order's tail.
        order = rng.permutation(n_img + 2)
        test_imgs = [image_ids[int(i)] for i in sorted(order[:n_img])]
        dev_imgs = [image_ids[int(i)] for i in sorted(order[n_img:])]
        thetas = findings.orientations(rng)
        period = uniform(rng, (3.8, 4.6))
        modulation = _MODULATION[tier]
        # The same number of spots on every test image, their types balanced over the
        # task and dealt at random: what an image holds is the only thing that varies.
        q = -(-_SPOTS * n_img // findings.TYPES)
        kinds = rng.permutation(np.repeat(np.arange(findings.TYPES), q))[: _SPOTS * n_img]
        plan = []
        for k, image_id in enumerate(test_imgs):
            conv = "radiological" if rng.random() < 0.7 else "neurological"
            spots = _spots(rng, kinds[k * _SPOTS : (k + 1) * _SPOTS])
            plan.append((image_id, conv, spots, "test"))
        # Worked examples: one spot of every type, all in one lung, so their answers
        # (one nodule, that lung) say nothing of which texture is the nodule's.
        for image_id, conv in zip(dev_imgs, ("radiological", "neurological"), strict=True):
            side = "right" if rng.random() < 0.5 else "left"
            spots = [(k, r, side) for k, r in enumerate(rng.permutation(_DEV_RADII))]
            plan.append((image_id, conv, spots, "dev"))
        files: dict[str, bytes] = {}
        meta, questions, dev_questions, answers = [], [], [], {}
        qids = iter(case_ids(rng, "q", 3 * (n_img + 2)))
        spacing = round(380.0 / size, 3)
        for image_id, conv, spots, where in plan:
            # Worked examples are clear teaching cases on either tier.
            mod = modulation if where == "test" else _MODULATION["easy"]
            img, nodules = _render(rng, size, noise, conv, spots, thetas, period, mod)
            folder = "data/images" if where == "test" else "data/dev/images"
            files[f"{folder}/{image_id}.png"] = png_bytes(
                img,
                {
                    "ViewConvention": conv,
                    "PixelSpacing": f"{spacing}",
                    "Window": "lung (W1500 L-600)",
                },
            )
            meta.append(
                {"image_id": image_id, "view_convention": conv, "pixel_spacing_mm": spacing}
            )
            for text, ans in _answers(nodules).items():
                qid = next(qids)
                if where == "test":
                    questions.append({"qid": qid, "image_id": image_id, "question": text})
                    answers[qid] = ans
                else:
                    dev_questions.append(
                        {"qid": qid, "image_id": image_id, "question": text, "answer": ans}
                    )
        # Questions in qid order: neither the images nor the answers set it.
        questions.sort(key=lambda q: q["qid"])
        files["data/questions.jsonl"] = "".join(json.dumps(q) + "\n" for q in questions).encode()
        files["data/dev/questions.jsonl"] = "".join(
            json.dumps(q) + "\n" for q in dev_questions
        ).encode()
        files["data/metadata.csv"] = csv_text(
            sorted(meta, key=lambda m: m["image_id"]),
            ["image_id", "view_convention", "pixel_spacing_mm"],
        ).encode()
        ids = tuple(q["qid"] for q in questions)
        task_json = {
            "inputs": {
                "format": ["PNG", "JSONL"],
                "questions": "data/questions.jsonl",
                "images": "data/images/{image_id}.png",
                "metadata": "data/metadata.csv",
                "worked_examples": "data/dev/questions.jsonl",
            },
            "output": {
                "kind": "csv_answers",
                "vocabulary": ["yes", "no", "0", "1", "2", "3", "4", "left", "right", "none"],
            },
            "submission": {"columns": ["id", "answer"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={
                "cases": len(ids),
                "images": n_img,
                "noise": noise,
                "image_px": size,
                "difficulty": tier,
            },
            files=files,
            weights=self.weights(float(thetas[0]), period),
            model_card=MODEL_CARD,
            task_md=TASK_MD,
            task_json=task_json,
            # The dev answers are public (worked examples); kept here too so that S3
            # can score a pilot run on one of them with the task metric.
            answers={
                "answers": answers,
                "worked": {q["qid"]: q["answer"] for q in dev_questions},
            },
        )

    def reduce_extra_drops(self, draw: Draw, keep: Sequence[str]) -> frozenset[str]:
        """The test images that none of the kept questions is about."""
        questions = [json.loads(ln) for ln in draw.files["data/questions.jsonl"].splitlines()]
        used = {q["image_id"] for q in questions if q["qid"] in set(keep)}
        return frozenset(q["image_id"] for q in questions) - used

    def reduce(self, draw: Draw, max_cases: int) -> Draw:
        """As :meth:`TrackBase.reduce`, with ``params["images"]`` the kept image count."""
        out = super().reduce(draw, max_cases)
        if out is draw:
            return draw
        images = sum(1 for p in out.files if p.startswith("data/images/"))
        return replace(out, params={**out.params, "images": images})

    def known_ids(self, draw: Draw) -> frozenset[str]:
        """The test questions and the worked examples of data/dev."""
        return frozenset(draw.case_ids) | frozenset(draw.answers["worked"])

    def score_case(self, draw: Draw, workspace: Path, row: Mapping[str, str], cid: str) -> float:
        """Exact match of the submitted answer to question ``cid``."""
        known = (
            draw.answers["answers"] if cid in draw.answers["answers"] else draw.answers["worked"]
        )
        truth = known[cid]
        return float(metrics.exact_match(row.get("answer") or "", truth))

    def recipe(self) -> Recipe:  # noqa: D102
        return Recipe(
            plan=(
                "Read data/questions.jsonl, the PNGs (Pillow, /255) and data/metadata.csv; record each "
                "image's display convention (also in the PNG tEXt chunk). The model's side answers assume "
                "neurological display unless told the convention.",
                "pipeline/infer.py runs infer_lib.find_nodules and infer_lib.answer with each image's "
                "convention. Validate on a worked example from data/dev whose answer depends on the "
                "convention (a side question on a radiological image).",
                "Write outputs/predictions.csv, then outputs/submission.csv (id,answer) with one row per qid "
                "in task.json order and answers in the allowed vocabulary, with receipts.",
            ),
            out_dir="outputs",
            **recipe_scripts(self.name),
            says={
                "inspect": "Recording the environment, reading the questions, the images and their "
                "metadata, then pinning and smoke-testing the model.",
                "pipeline": "Most images are in radiological display and the model defaults to "
                "neurological, so the pipeline passes each image's convention from data/metadata.csv.",
                "pipeline_bug": "Writing the pipeline: find the nodules in each image and let the model "
                "answer the question.",
                "pilot": "Pilot on a worked example whose answer depends on left/right: a side question on "
                "a radiological image, compared with its given answer.",
                "bug_seen": "The pilot answered the opposite side from the worked example: the image is in "
                "radiological display and the model assumed neurological.",
                "fix": "Passing each image's view convention from data/metadata.csv to the model, then "
                "rerunning the pilot.",
            },
        )
