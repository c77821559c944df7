"""S3, weak: the first case's output has the input's shape."""

import nibabel as nib
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
shape_in = nib.load(f"data/test/{case_id}_A.nii.gz").shape
shape_out = nib.load(rows[0]["output_file"]).shape
checks = {"output shape equals input shape": {"value": list(shape_out), "expect": list(shape_in), "ok": shape_out == shape_in}}
