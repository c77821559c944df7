"""S3, weak: the first case's detections are boxes of five numbers."""

import json
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
found = json.load(open(rows[0]["detections_file"]))["boxes"]
print("pilot", case_id, "boxes", found)
checks = {"detections JSON has boxes of 5 numbers": {"value": len(found), "expect": "list of [x0, y0, x1, y1, score]",
                                                     "ok": all(len(b) == 5 for b in found)}}
