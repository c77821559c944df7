"""S3 of the classification track, the failure outcome: a pilot that checks shapes and formats only.

Spliced into the teacher's pilot script like ``s3_pilot.py`` (``case_ids`` and
``infer`` given; sets ``case_id`` and ``checks``), but blind to the track's mistake.
"""

case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
print("pilot", case_id, "->", rows[0])
checks = {"one row with id,label,confidence": {"value": sorted(rows[0]), "expect": "id, label, confidence",
                                              "ok": len(rows) == 1 and {"id", "label", "confidence"} <= set(rows[0])}}
