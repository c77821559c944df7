"""S5: the predictions in the submission's columns and case order, checked, then written.

Slots: ``SLOT_RECEIPT`` and ``SLOT_CHECK`` (the track's ``s5_submit_check.py``, which
appends what is wrong with ``rows`` to ``problems``).
"""

import csv, json, os
SLOT_RECEIPT

schema = json.load(open("task.json"))["submission"]
cols, ids = schema["columns"], schema["case_ids"]
pred = {r["id"]: r for r in csv.DictReader(open("outputs/predictions.csv"))}
missing = [i for i in ids if i not in pred]
assert not missing, f"cases missing from predictions: {missing}"
rows = [{c: pred[i][c] for c in cols} for i in ids]
problems = []
SLOT_CHECK
assert not problems, problems
with open("outputs/submission.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
receipt("S5", "outputs/submission.csv", "validation/s5_submission.json",
        rows=len(rows), columns=cols, format_valid=True)
print("submission:", len(rows), "rows, columns", cols)
