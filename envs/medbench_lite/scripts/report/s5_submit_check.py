"""S5 of the report track: check the submission rows before they are written.

Spliced into the teacher's submit script, which gives ``rows`` (the submission rows
in case order) and ``problems`` (a list) and has imported ``json``. Appends what is
wrong to ``problems``; the script refuses to submit when it is not empty.
"""

import re
pat = re.compile(r"^- (Nodule: (right|left) (upper|middle|lower) lobe, [0-9.]+ mm\.|No pulmonary nodules\.)$")
for r in rows:
    text = open(r["report_file"]).read()
    body = text.split("FINDINGS:")[1].split("IMPRESSION:")[0].strip().splitlines() if "FINDINGS:" in text else []
    if not body or not all(pat.match(line) for line in body):
        problems.append(r["id"] + ": FINDINGS lines not in the required format")
