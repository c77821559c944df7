"""S2: every stack's shape, stored type, scaling and HU range."""

import nibabel as nib
cases = {}
for i in case_ids:
    img = nib.load(f"data/images/{i}.nii.gz")
    hu = img.get_fdata()
    cases[i] = {"shape": list(img.shape), "stored_dtype": str(img.get_data_dtype()),
                "scl_slope_inter": [float(img.dataobj.slope), float(img.dataobj.inter)],
                "hu_range": [round(float(hu.min())), round(float(hu.max()))]}
compat = {"input_format": "NIfTI-1 .nii.gz", "readable": len(cases), "expected": len(case_ids), "cases": cases,
          "model_input": "HU window [-1000, 1000] normalized to [0, 1] (model card)"}
print(len(cases), "of", len(case_ids), "stacks readable")
for i, c in cases.items():
    print(i, c["shape"], c["stored_dtype"], "scl slope/inter", c["scl_slope_inter"], "HU", c["hu_range"])
