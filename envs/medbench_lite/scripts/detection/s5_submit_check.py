"""S5: every detections file names its case and holds well-formed boxes."""

for r in rows:
    d = json.load(open(r["detections_file"]))
    if d.get("id") != r["id"] or not all(len(b) == 5 and b[2] > b[0] and b[3] > b[1] for b in d["boxes"]):
        problems.append(r["id"] + ": detections file malformed")
