"""S3: a worked side question on a radiological image gets its known answer."""

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
    "answer in the allowed vocabulary": {"value": got, "expect": "yes/no/digit/left/right/none", "ok": got in ("yes", "no", "left", "right", "none") or got.isdigit()},
}
# The receipt states this check: its figure is what the verifier recomputes.
figure = ('answer', 'answer matches the worked example')
