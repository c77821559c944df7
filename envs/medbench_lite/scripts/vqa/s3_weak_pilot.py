"""S3, weak: the first question gets a non-empty answer."""

case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
got = rows[0]["answer"]
print("pilot", case_id, "->", got)
checks = {"answer is non-empty text": {"value": got, "expect": "non-empty", "ok": bool(got.strip())}}
