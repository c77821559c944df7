"""S3: on the most confident image, the top boxes read x-first are brighter than their ring, and brighter than read transposed."""

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
# Read each box the way the scorer will: x = column, y = row. A lesion is brighter than
# the ring of background around it (the image median is no reference: the background
# itself varies by more than a lesion's margin). The median over the top three boxes
# is not swayed by one look-alike ranked first. The same boxes read transposed, as
# [x0:x1, y0:y1], must be darker: a transposed box can land on a vessel by chance, but
# then the other reading lands on the lesions.
def local_contrast(b):
    x0, y0, x1, y1 = int(b[0]), int(b[1]), int(np.ceil(b[2])), int(np.ceil(b[3]))
    m = max(x1 - x0, y1 - y0) // 2
    inner = x[y0:y1, x0:x1]
    outer = x[max(y0 - m, 0):y1 + m, max(x0 - m, 0):x1 + m]
    if inner.size == 0:
        return -1.0
    return float(inner.mean() - (outer.sum() - inner.sum()) / max(outer.size - inner.size, 1))
top = [local_contrast(b) for b in found[:3]]
swapped = [local_contrast([b[1], b[0], b[3], b[2]]) for b in found[:3]]
top = float(np.median(top)) if top else None
swapped = float(np.median(swapped)) if swapped else None
print("pilot", case_id, "image", x.shape, "boxes", found)
checks = {
    "at least one box on the pilot image": {"value": len(found), "expect": ">= 1", "ok": len(found) >= 1},
    "boxes inside the image": {"value": inside, "expect": True, "ok": bool(inside)},
    "top-3 boxes' median contrast over the surrounding ring, read as [y0:y1, x0:x1]": {
        "value": None if top is None else round(top, 3), "expect": ">= 0.1 (card: a lesion is 0.2 brighter)",
        "ok": top is not None and top >= 0.1},
    "the same, read transposed as [x0:x1, y0:y1]": {
        "value": None if swapped is None else round(swapped, 3), "expect": "below the reading above",
        "ok": top is not None and swapped is not None and swapped < top},
}
# The receipt states this check: its figure is what the verifier recomputes.
figure = ('box_contrast', "top-3 boxes' median contrast over the surrounding ring, read as [y0:y1, x0:x1]")
