"""S2 of the segmentation track: open every input and record what the model needs.

Spliced into the teacher's setup script, which gives ``case_ids`` (task.json's case
ids) and has imported ``json`` and ``os``. Sets ``compat``, a JSON-able dict the
script writes to ``setup/compatibility.json``.
"""

import nibabel as nib
cases = {}
for i in case_ids:
    img = nib.load(f"data/images/{i}.nii.gz")
    cases[i] = {"shape": list(img.shape), "axcodes": "".join(nib.aff2axcodes(img.affine)),
                "spacing_mm": [round(float(z), 2) for z in img.header.get_zooms()[:3]]}
not_ras = [i for i, c in cases.items() if c["axcodes"] != "RAS"]
compat = {"input_format": "NIfTI-1 .nii.gz", "readable": len(cases), "expected": len(case_ids),
          "cases": cases, "model_input": "HU, RAS+ voxel order (model card)",
          "not_ras_plus": not_ras}
print(len(cases), "of", len(case_ids), "volumes readable")
print("orientations:", {i: c["axcodes"] for i, c in cases.items()})
print("not RAS+ (need reorientation):", not_ras)
