"""The naive baseline's S5: the predictions in the submission's columns, unchecked.

Slot: ``SLOT_RECEIPT`` (the receipt is what the task asks for; nothing is checked).
"""

SLOT_RECEIPT
import csv
cols = json.load(open("task.json"))["submission"]["columns"]
rows = list(csv.DictReader(open("outputs/predictions.csv")))
with open("outputs/submission.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
receipt("S5", "outputs/submission.csv", "validation/s5_submission.json", rows=len(rows))
print("submitted", len(rows), "rows")
