"""S3 of the vqa track, the failure outcome: a pilot that checks shapes and formats only.

Spliced into the teacher's pilot script like ``s3_pilot.py`` (``case_ids`` and
``infer`` given; sets ``case_id`` and ``checks``), but blind to the track's mistake.
"""

case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
got = rows[0]["answer"]
print("pilot", case_id, "->", got)
checks = {"answer is non-empty text": {"value": got, "expect": "non-empty", "ok": bool(got.strip())}}
