"""The naive baseline's S4: run the pipeline on every case, no receipt.

Slot: ``SLOT_OUT_DIR`` (a string: the track's per-case output directory).
"""

import csv, json, os, sys
sys.path.insert(0, "pipeline")
import infer

task = json.load(open("task.json"))
ids = task["submission"]["case_ids"]
os.makedirs("outputs", exist_ok=True)
infer.run(ids, "outputs/predictions.csv", SLOT_OUT_DIR)
print("predicted", len(ids), "cases")
