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
    # Side answers depend on the display convention recorded for each image.
    convention = META[q["image_id"]]["view_convention"]
    return infer_lib.answer(q["question"], nodules, image.shape[1], convention=convention)


def run(ids, out_csv, out_dir=None):
    rows = [{"id": qid, "answer": answer(qid)} for qid in ids]
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
