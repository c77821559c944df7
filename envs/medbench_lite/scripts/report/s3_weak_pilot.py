"""S3 of the report track, the failure outcome: a pilot that checks shapes and formats only.

Spliced into the teacher's pilot script like ``s3_pilot.py`` (``case_ids`` and
``infer`` given; sets ``case_id`` and ``checks``), but blind to the track's mistake.
"""

case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
text = open(rows[0]["report_file"]).read()
print(text)
checks = {"report has a FINDINGS section": {"value": "FINDINGS:" in text, "expect": True, "ok": "FINDINGS:" in text}}
