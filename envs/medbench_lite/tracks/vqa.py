"""VQA track: questions about rendered axial chest CT slices (PNG + JSONL).

Each task has test images with templated questions (presence, count, which lung holds
the nodule or the largest nodule) and a small dev set whose answers are given. About
70% of the images are in radiological display convention (the patient's right on the
image left), the rest neurological; each PNG says which in a tEXt chunk and in
``data/metadata.csv``.

TRAP (left/right convention): the model's side answers assume neurological display
unless told otherwise. Run with its default, every side answer on a radiological image
is mirrored. A pilot on a dev side question of a radiological image catches it.
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
from bat_gym.envs.medbench_lite.teacher import Recipe
from bat_gym.envs.medbench_lite.tracks.base import (
    Draw,
    Split,
    TrackBase,
    case_ids,
    uniform,
)

__all__ = ["Vqa"]

Q_PRESENCE = "Is there a pulmonary nodule in this slice?"
Q_COUNT = "How many pulmonary nodules are visible in this slice?"
Q_SIDE = "Which lung contains the nodule, left or right?"
Q_LARGEST = "Which lung contains the largest nodule, left or right?"

MODEL_CARD = """# Model card: chest-vqa-rules v0.4

Answers templated questions about pulmonary nodules on axial chest CT slices
(lung window). Parameters: model/weights.npz. Code: model/infer_lib.py (numpy only).

## Input convention
- `image`: 2D float array in [0, 1] (8-bit PNG / 255), anterior at the top.
- `convention`: how the slice is displayed. `"neurological"` (the default): the
  patient's left is on the image left. `"radiological"`: the patient's right is on
  the image left. Side answers ("left"/"right") are in **patient** terms and are
  only right when the convention matches the image.

## Output
`answer(question, nodules, width, convention)` -> "yes"/"no", a count ("0".."3"),
or "left"/"right".

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
question id in task.json. Answers: "yes"/"no", a digit, or "left"/"right" (the
patient's side).
Metric: exact match after normalization. A missing question scores the task 0.
"""

PIPELINE = '''
"""Question answering for every question id: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "answer"]
QUESTIONS = {}
for sub in ("", "dev"):
    for line in open(os.path.join(ROOT, "data", sub, "questions.jsonl")):
        q = json.loads(line)
        QUESTIONS[q["qid"]] = dict(q, dir=os.path.join(ROOT, "data", sub, "images"))
META = {r["image_id"]: r for r in csv.DictReader(open(os.path.join(ROOT, "data", "metadata.csv")))}


def answer(qid):
    q = QUESTIONS[qid]
    image = np.asarray(Image.open(os.path.join(q["dir"], q["image_id"] + ".png")), dtype=np.float64) / 255.0
    nodules = infer_lib.find_nodules(image, W)
__ANSWER__


def run(ids, out_csv, out_dir=None):
    rows = [{"id": qid, "answer": answer(qid)} for qid in ids]
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
'''

_ANSWER_GOOD = """    # Side answers depend on the display convention recorded for each image.
    convention = META[q["image_id"]]["view_convention"]
    return infer_lib.answer(q["question"], nodules, image.shape[1], convention=convention)"""

_ANSWER_BUG = """    return infer_lib.answer(q["question"], nodules, image.shape[1])"""

INSPECT = """
import csv
from PIL import Image
qs = [json.loads(line) for line in open("data/questions.jsonl")]
dev = [json.loads(line) for line in open("data/dev/questions.jsonl")]
meta = {r["image_id"]: r for r in csv.DictReader(open("data/metadata.csv"))}
images = {}
for q in qs:
    im = Image.open(f"data/images/{q['image_id']}.png")
    images[q["image_id"]] = {"size": list(im.size), "mode": im.mode, "png_text": dict(im.text),
                             "metadata_convention": meta[q["image_id"]]["view_convention"]}
conv = {}
for v in images.values():
    conv[v["metadata_convention"]] = conv.get(v["metadata_convention"], 0) + 1
compat = {"input_format": "PNG + JSONL", "questions": len(qs), "expected": len(case_ids), "dev_questions": len(dev),
          "images": images, "display_conventions": conv,
          "model_input": "float image in [0, 1]; convention argument, default neurological (model card)"}
print(len(qs), "questions on", len(images), "images;", len(dev), "dev questions with answers")
print("display conventions:", conv)
print("question types:", sorted({q["question"] for q in qs}))
"""

SMOKE = """
import numpy as np
toy = np.full((64, 64), 0.85)
toy[16:48, 8:28] = 0.2
toy[16:48, 36:56] = 0.2
toy[30:35, 14:19] = 0.85
found = infer_lib.find_nodules(toy, W)
smoke = {"input": "two dark lungs, one blob in the image-left lung", "nodules": found,
         "answer_radiological": infer_lib.answer("Which lung contains the nodule, left or right?", found, 64, convention="radiological")}
"""

PILOT = """
import csv
dev = [json.loads(line) for line in open("data/dev/questions.jsonl")]
meta = {r["image_id"]: r for r in csv.DictReader(open("data/metadata.csv"))}
# Pilot a worked example that depends on the display convention: a side question on a radiological image.
side = [q for q in dev if "which lung" in q["question"].lower()]
pick = next((q for q in side if meta[q["image_id"]]["view_convention"] == "radiological"), (side or dev)[0])
case_id = pick["qid"]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
got = rows[0]["answer"]
print("pilot", case_id, "on", pick["image_id"], "(" + meta[pick["image_id"]]["view_convention"] + ")", repr(pick["question"]), "->", got, "| worked answer:", pick["answer"])
checks = {
    "answer matches the worked example": {"value": got, "expect": pick["answer"], "ok": got.strip().lower() == pick["answer"].strip().lower()},
    "answer in the allowed vocabulary": {"value": got, "expect": "yes/no/digit/left/right", "ok": got in ("yes", "no", "left", "right") or got.isdigit()},
}
"""

WEAK_PILOT = """
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
got = rows[0]["answer"]
print("pilot", case_id, "->", got)
checks = {"answer is non-empty text": {"value": got, "expect": "non-empty", "ok": bool(got.strip())}}
"""

SUBMIT_CHECK = """
for r in rows:
    if not (r["answer"] in ("yes", "no", "left", "right") or r["answer"].isdigit()):
        problems.append(r["id"] + ": answer outside the vocabulary: " + r["answer"])
"""


def _render(
    rng: np.random.Generator, size: int, noise: float, convention: str, n_nodules: int
) -> tuple[np.ndarray, list[dict]]:
    """A lung-window slice (uint8) and its nodules (patient side, radius in px)."""
    y, c = (np.mgrid[:size, :size] + 0.5) / size * 2 - 1
    # +p is the patient's left. Radiological display puts the patient's right on the image left.
    p = c if convention == "radiological" else -c
    img = np.full((size, size), 0.05)
    img[(p / 0.92) ** 2 + (y / 0.72) ** 2 <= 1] = 0.85
    lungs = {
        "right": (-0.42 + rng.uniform(-0.02, 0.02), -0.05, 0.33 + rng.uniform(-0.02, 0.02), 0.5),
        "left": (0.45 + rng.uniform(-0.02, 0.02), -0.05, 0.30 + rng.uniform(-0.02, 0.02), 0.48),
    }
    for cp, cy, ap, ay in lungs.values():
        inside = ((p - cp) / ap) ** 2 + ((y - cy) / ay) ** 2 <= 1
        img[inside] = 0.2 + 0.03 * rng.standard_normal()
    img[((p - 0.02) / 0.15) ** 2 + ((y + 0.3) / 0.2) ** 2 <= 1] = (
        0.9  # heart, anterior, a little to the left
    )
    img[(p**2 + (y - 0.5) ** 2) <= 0.12**2] = 1.0
    nodules: list[dict] = []
    sides = ["right", "left"]
    for k in range(n_nodules):
        side = sides[int(rng.integers(0, 2))]
        for _try in range(200):
            r_px = float(rng.uniform(2.5, 6.0)) if k == 0 else float(rng.uniform(2.5, 6.0))
            cp, cy, ap, ay = lungs[side]
            t, rho = rng.uniform(0, 2 * np.pi), np.sqrt(rng.uniform(0, 1))
            r_n = 2 * (r_px + 4) / size  # radius plus a lung margin, in normalized units
            npc, nyc = (
                cp + rho * max(ap - r_n, 0.01) * np.cos(t),
                cy + rho * max(ay - r_n, 0.01) * np.sin(t),
            )
            ok_size = all(abs(r_px - n["r_px"]) >= 1.5 for n in nodules)
            ok_gap = all(
                np.hypot(npc - n["p"], nyc - n["y"]) * size / 2 > r_px + n["r_px"] + 4
                for n in nodules
            )
            heart = ((npc - 0.02) / 0.15) ** 2 + ((nyc + 0.3) / 0.2) ** 2 <= 1.6
            if ok_size and ok_gap and not heart:
                nodules.append({"side": side, "p": float(npc), "y": float(nyc), "r_px": r_px})
                break
    for n in nodules:
        d_px = np.hypot(p - n["p"], y - n["y"]) * size / 2
        img = np.maximum(img, 0.85 * np.clip(n["r_px"] + 0.5 - d_px, 0, 1))
    img = np.clip(metrics._box_filter(img, 3) + rng.normal(0, noise, img.shape), 0, 1)
    return np.rint(img * 255).astype(np.uint8), nodules


def _questions(nodules: list[dict]) -> list[tuple[str, str]]:
    if not nodules:
        return [(Q_PRESENCE, "no"), (Q_COUNT, "0")]
    if len(nodules) == 1:
        return [(Q_SIDE, nodules[0]["side"]), (Q_PRESENCE, "yes")]
    big = max(nodules, key=lambda n: n["r_px"])
    return [(Q_LARGEST, big["side"]), (Q_COUNT, str(len(nodules)))]


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

    def weights(self) -> dict[str, np.ndarray]:
        """The model's parameters (the same for every task)."""
        return {
            "lung_below": np.array(0.45),
            "tissue_above": np.array(0.55),
            "reach_px": np.array(24),
            "min_area": np.array(6),
            "max_area": np.array(200),
        }

    def draw(self, seed: int, split: Split) -> Draw:  # noqa: D102
        rng = self.rng(seed, split)
        rg = self.ranges[split]
        noise = uniform(rng, rg["noise"])
        size = int(rng.integers(int(rg["image_px"][0]), int(rg["image_px"][1]) + 1))
        n_img = int(rng.integers(4, 7))
        image_ids = case_ids(rng, "slice", n_img + 2)
        test_imgs, dev_imgs = image_ids[:n_img], image_ids[n_img:]
        conventions = ["radiological" if rng.random() < 0.7 else "neurological" for _ in test_imgs]
        counts = [int(rng.choice([0, 1, 1, 2, 2])) for _ in test_imgs]
        # Keep the trap live: a radiological image with a side question in every task.
        conventions[0], counts[0] = "radiological", max(counts[0], 1)
        files: dict[str, bytes] = {}
        meta, questions, dev_questions, answers = [], [], [], {}
        qids = iter(case_ids(rng, "q", 2 * n_img + 4))
        spacing = round(380.0 / size, 3)
        plan = [(i, c, k, "test") for i, c, k in zip(test_imgs, conventions, counts, strict=True)]
        plan += [(dev_imgs[0], "radiological", 1, "dev"), (dev_imgs[1], "neurological", 2, "dev")]
        for image_id, conv, k, where in plan:
            img, nodules = _render(rng, size, noise, conv, k)
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
            for text, ans in _questions(nodules):
                qid = next(qids)
                if where == "test":
                    questions.append({"qid": qid, "image_id": image_id, "question": text})
                    answers[qid] = ans
                else:
                    dev_questions.append(
                        {"qid": qid, "image_id": image_id, "question": text, "answer": ans}
                    )
        # Shuffle the question order so it does not follow the images.
        order = rng.permutation(len(questions))
        questions = [questions[int(i)] for i in order]
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
                "vocabulary": ["yes", "no", "0", "1", "2", "3", "left", "right"],
            },
            "submission": {"columns": ["id", "answer"], "case_ids": list(ids)},
        }
        return Draw(
            case_ids=ids,
            params={"cases": len(ids), "images": n_img, "noise": noise, "image_px": size},
            files=files,
            weights=self.weights(),
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

    def score_cases(  # noqa: D102
        self,
        draw: Draw,
        workspace: Path,
        rows: Mapping[str, Mapping[str, str]],
        ids: Sequence[str],
    ) -> float:
        truth = {**draw.answers["worked"], **draw.answers["answers"]}
        hits = [metrics.exact_match(rows[q].get("answer") or "", truth[q]) for q in ids]
        return float(np.mean(hits))

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
            inspect=INSPECT,
            smoke=SMOKE,
            pipeline=PIPELINE.replace("__ANSWER__", _ANSWER_GOOD),
            pipeline_bug=PIPELINE.replace("__ANSWER__", _ANSWER_BUG),
            naive_pipeline=PIPELINE.replace("__ANSWER__", _ANSWER_BUG),
            pilot=PILOT,
            weak_pilot=WEAK_PILOT,
            out_dir="outputs",
            submit_check=SUBMIT_CHECK,
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
