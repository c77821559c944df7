"""S2: every image's photometric interpretation and rescale; which are MONOCHROME1."""

import pydicom
cases = {}
for i in case_ids:
    ds = pydicom.dcmread(f"data/images/{i}.dcm")
    cases[i] = {"shape": [int(ds.Rows), int(ds.Columns)], "photometric": str(ds.PhotometricInterpretation),
                "slope": float(ds.get("RescaleSlope", 1)), "intercept": float(ds.get("RescaleIntercept", 0))}
mono1 = [i for i, c in cases.items() if c["photometric"] == "MONOCHROME1"]
rescaled = [i for i, c in cases.items() if (c["slope"], c["intercept"]) != (1.0, 0.0)]
compat = {"input_format": "DICOM", "readable": len(cases), "expected": len(case_ids), "cases": cases,
          "model_input": "modality values, MONOCHROME2 sense, 0..4095 (model card)",
          "monochrome1": mono1, "rescaled": rescaled}
print(len(cases), "of", len(case_ids), "files readable")
print("MONOCHROME1 (inverted):", mono1)
print("rescale (slope, intercept) values:", sorted({(c["slope"], c["intercept"]) for c in cases.values()}))
