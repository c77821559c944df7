"""S3 of the synthesis track, the failure outcome: a pilot that checks shapes and formats only.

Spliced into the teacher's pilot script like ``s3_pilot.py`` (``case_ids`` and
``infer`` given; sets ``case_id`` and ``checks``), but blind to the track's mistake.
"""

import nibabel as nib
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
shape_in = nib.load(f"data/test/{case_id}_A.nii.gz").shape
shape_out = nib.load(rows[0]["output_file"]).shape
checks = {"output shape equals input shape": {"value": list(shape_out), "expect": list(shape_in), "ok": shape_out == shape_in}}
