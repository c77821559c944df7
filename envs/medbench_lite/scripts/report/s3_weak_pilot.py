"""S3, weak: the first case's report has a FINDINGS section."""

case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
text = open(rows[0]["report_file"]).read()
print(text)
checks = {"report has a FINDINGS section": {"value": "FINDINGS:" in text, "expect": True, "ok": "FINDINGS:" in text}}
