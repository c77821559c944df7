"""S2: every volume's shape, spacing and voxel order; which are not RAS+."""

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
