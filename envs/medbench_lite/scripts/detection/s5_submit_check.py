"""S5 of the detection track: check the submission rows before they are written.

Spliced into the teacher's submit script, which gives ``rows`` (the submission rows
in case order) and ``problems`` (a list) and has imported ``json``. Appends what is
wrong to ``problems``; the script refuses to submit when it is not empty.
"""

for r in rows:
    d = json.load(open(r["detections_file"]))
    if d.get("id") != r["id"] or not all(len(b) == 5 and b[2] > b[0] and b[3] > b[1] for b in d["boxes"]):
        problems.append(r["id"] + ": detections file malformed")
