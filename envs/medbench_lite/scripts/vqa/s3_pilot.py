"""S3: a worked side question on a radiological image gets its known answer, where its nodule lies."""

import csv
import numpy as np
from PIL import Image
dev = [json.loads(line) for line in open("data/dev/questions.jsonl")]
meta = {r["image_id"]: r for r in csv.DictReader(open("data/metadata.csv"))}
# Pilot a worked example that depends on the display convention: a side question on a
# radiological image whose answer names a lung (a mirrored reading names the other).
side = [q for q in dev if "which lung" in q["question"].lower()]
pick = next((q for q in side if meta[q["image_id"]]["view_convention"] == "radiological" and q["answer"] in ("left", "right")),
            next((q for q in side if meta[q["image_id"]]["view_convention"] == "radiological"), (side or dev)[0]))
case_id = pick["qid"]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
got = rows[0]["answer"]
# Where the largest nodule lies on the image: with the display convention, which lung it is in.
image = np.asarray(Image.open("data/dev/images/" + pick["image_id"] + ".png"), dtype=np.float64) / 255.0
nodules = infer.infer_lib.find_nodules(image, infer.W)
col = max(nodules, key=lambda n: n["diameter_px"])["col"] if nodules else None
print("pilot", case_id, "on", pick["image_id"], "(" + meta[pick["image_id"]]["view_convention"] + ")", repr(pick["question"]), "->", got, "| worked answer:", pick["answer"])
print("largest nodule at column", col, "of", image.shape[1], "(image left = 0)")
checks = {
    "answer matches the worked example": {"value": got, "expect": pick["answer"], "ok": got.strip().lower() == pick["answer"].strip().lower()},
    "largest nodule's image column, answer matches the worked example": {
        "value": col, "expect": "a nodule found; answer " + pick["answer"],
        "ok": col is not None and got.strip().lower() == pick["answer"].strip().lower()},
    "answer in the allowed vocabulary": {"value": got, "expect": "yes/no/digit/left/right/none", "ok": got in ("yes", "no", "left", "right", "none") or got.isdigit()},
}
# The receipt states this check: its figure is what the verifier recomputes.
figure = ('nodule_col_px', "largest nodule's image column, answer matches the worked example")
