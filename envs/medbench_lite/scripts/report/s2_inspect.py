"""S2: every volume's shape, spacing and orientation, and its metadata."""

import nibabel as nib
meta = json.load(open("data/metadata.json"))
cases = {}
for i in case_ids:
    img = nib.load(f"data/images/{i}.nii.gz")
    cases[i] = {"shape": list(img.shape), "axcodes": "".join(nib.aff2axcodes(img.affine)),
                "spacing_mm": [round(float(z), 3) for z in img.header.get_zooms()[:3]], "has_metadata": i in meta}
compat = {"input_format": "NIfTI-1 .nii.gz + metadata.json", "readable": len(cases), "expected": len(case_ids),
          "cases": cases, "model_input": "HU, RAS+; sizes in units of the spacing argument (model card)"}
print(len(cases), "of", len(case_ids), "volumes readable; metadata for", sum(c["has_metadata"] for c in cases.values()))
for i, c in cases.items():
    print(i, c["shape"], c["axcodes"], "spacing mm", c["spacing_mm"])
