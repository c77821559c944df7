"""S3: on the most confident image, the top box read x-first covers a bright blob."""

import json
import numpy as np
# Pilot the image with the model's most confident detection, so there is a box to
# check and a wrong box means a wrong pipeline rather than a hard case.
def confidence(i):
    found = infer.infer_lib.detect(infer.load_image(infer.image_path(i)), infer.W)
    return found[0]["score"] if found else 0.0
case_id = max(case_ids, key=confidence)
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
x = infer.load_image(infer.image_path(case_id))
found = sorted(json.load(open(rows[0]["detections_file"]))["boxes"], key=lambda b: -b[4])
h, w = x.shape
inside = all(0 <= b[0] < b[2] <= w and 0 <= b[1] < b[3] <= h for b in found)
# Read each box the way the scorer will: x = column, y = row.
contrast = [float(x[int(b[1]):int(np.ceil(b[3])), int(b[0]):int(np.ceil(b[2]))].mean() - np.median(x)) for b in found]
print("pilot", case_id, "image", x.shape, "boxes", found)
checks = {
    "at least one box on the pilot image": {"value": len(found), "expect": ">= 1", "ok": len(found) >= 1},
    "boxes inside the image": {"value": inside, "expect": True, "ok": bool(inside)},
    "top-scored box contrast over image median, read as [y0:y1, x0:x1]": {
        "value": round(contrast[0], 3) if contrast else None, "expect": ">= 0.1 (card)",
        "ok": bool(contrast) and contrast[0] >= 0.1},
}
