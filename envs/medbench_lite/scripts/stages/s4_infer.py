"""S4: run the pipeline on every case and record which were predicted.

Slots: ``SLOT_RECEIPT`` and ``SLOT_OUT_DIR`` (a string: the track's per-case output
directory).
"""

import csv, json, os, sys
sys.path.insert(0, "pipeline")
import infer
SLOT_RECEIPT

task = json.load(open("task.json"))
ids = task["submission"]["case_ids"]
os.makedirs("outputs", exist_ok=True)
rows = infer.run(ids, "outputs/predictions.csv", SLOT_OUT_DIR)
done = [r["id"] for r in rows]
missing = [i for i in ids if i not in done]
print(len(done), "of", len(ids), "cases predicted; missing:", missing)
receipt("S4", "outputs/predictions.csv", "validation/s4_completion.json",
        cases=len(ids), completed=len(done), missing=missing, output_dir=SLOT_OUT_DIR)
