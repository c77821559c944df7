"""S5: every label is 0 or 1 and every confidence within 0..1."""

for r in rows:
    if r["label"] not in ("0", "1"):
        problems.append(r["id"] + ": label must be 0 or 1")
    if not 0.0 <= float(r["confidence"]) <= 1.0:
        problems.append(r["id"] + ": confidence outside 0..1")
