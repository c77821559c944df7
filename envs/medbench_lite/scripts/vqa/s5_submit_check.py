"""S5: every answer is in the answer vocabulary."""

for r in rows:
    if not (r["answer"] in ("yes", "no", "left", "right", "none") or r["answer"].isdigit()):
        problems.append(r["id"] + ": answer outside the vocabulary: " + r["answer"])
