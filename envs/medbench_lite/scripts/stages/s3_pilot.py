"""S3: run the pipeline on one case and check it; write the receipt only if it passes.

Slots: ``SLOT_RECEIPT``, ``SLOT_PILOT`` (the track's ``s3_pilot.py`` or
``s3_weak_pilot.py``, which sets ``case_id`` and ``checks``, and may set ``figure``:
the figure's name and the key of ``checks`` the receipt states as its ``check``) and
``SLOT_LEVEL`` (a string: what kind of validation the receipt records).
"""

import csv, json, os, sys
sys.path.insert(0, "pipeline")
import infer
SLOT_RECEIPT

os.makedirs("validation", exist_ok=True)
task = json.load(open("task.json"))
case_ids = task["submission"]["case_ids"]
figure = None
SLOT_PILOT
for name, c in checks.items():
    print(("PASS" if c["ok"] else "FAIL"), name, "=", c["value"], "| expected", c["expect"])
if not all(c["ok"] for c in checks.values()):
    raise SystemExit("pilot on " + case_id + " failed its check; no S3 receipt written")
stated = {} if figure is None else {"check": {"case": case_id, "name": figure[0],
                                             "value": checks[figure[1]]["value"], "passed": checks[figure[1]]["ok"]}}
receipt("S3", "validation/pilot.csv", "validation/s3_validation.json", case_id=case_id,
        level=SLOT_LEVEL, checks=checks, passed=True, **stated)
print("S3 receipt written for pilot case", case_id)
