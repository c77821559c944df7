"""S3, weak: the first case gives one row with a label and a confidence."""

case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
print("pilot", case_id, "->", rows[0])
checks = {"one row with id,label,confidence": {"value": sorted(rows[0]), "expect": "id, label, confidence",
                                              "ok": len(rows) == 1 and {"id", "label", "confidence"} <= set(rows[0])}}
