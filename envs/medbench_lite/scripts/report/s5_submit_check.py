"""S5: every FINDINGS line is in the required format."""

import re
pat = re.compile(r"^- (Nodule: (right|left) (upper|middle|lower) lobe, [0-9.]+ mm\.|No pulmonary nodules\.)$")
for r in rows:
    text = open(r["report_file"]).read()
    body = text.split("FINDINGS:")[1].split("IMPRESSION:")[0].strip().splitlines() if "FINDINGS:" in text else []
    if not body or not all(pat.match(line) for line in body):
        problems.append(r["id"] + ": FINDINGS lines not in the required format")
