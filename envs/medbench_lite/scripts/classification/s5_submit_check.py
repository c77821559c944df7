"""S5 of the classification track: check the submission rows before they are written.

Spliced into the teacher's submit script, which gives ``rows`` (the submission rows
in case order) and ``problems`` (a list) and has imported ``json``. Appends what is
wrong to ``problems``; the script refuses to submit when it is not empty.
"""

for r in rows:
    if r["label"] not in ("0", "1"):
        problems.append(r["id"] + ": label must be 0 or 1")
    if not 0.0 <= float(r["confidence"]) <= 1.0:
        problems.append(r["id"] + ": confidence outside 0..1")
