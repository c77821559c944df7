"""S5 of the vqa track: check the submission rows before they are written.

Spliced into the teacher's submit script, which gives ``rows`` (the submission rows
in case order) and ``problems`` (a list) and has imported ``json``. Appends what is
wrong to ``problems``; the script refuses to submit when it is not empty.
"""

for r in rows:
    if not (r["answer"] in ("yes", "no", "left", "right", "none") or r["answer"].isdigit()):
        problems.append(r["id"] + ": answer outside the vocabulary: " + r["answer"])
