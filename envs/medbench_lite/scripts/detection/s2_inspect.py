"""S2: every image's format (PNG or DICOM), size and pixel encoding."""

import pydicom
from PIL import Image
cases = {}
for i in case_ids:
    if os.path.exists(f"data/images/{i}.png"):
        im = Image.open(f"data/images/{i}.png")
        cases[i] = {"format": "PNG", "mode": im.mode, "shape": [im.height, im.width]}
    else:
        ds = pydicom.dcmread(f"data/images/{i}.dcm")
        cases[i] = {"format": "DICOM", "photometric": str(ds.PhotometricInterpretation),
                    "shape": [int(ds.Rows), int(ds.Columns)], "bits_stored": int(ds.BitsStored)}
formats = sorted({c["format"] for c in cases.values()})
compat = {"input_format": formats, "readable": len(cases), "expected": len(case_ids), "cases": cases,
          "model_input": "float image in [0, 1]; boxes returned in (row, col) order (model card)",
          "submission_boxes": "[x0, y0, x1, y1, score], x = column (TASK.md)"}
print(len(cases), "of", len(case_ids), "images readable; formats:", {f: sum(c["format"] == f for c in cases.values()) for f in formats})
print("shapes:", sorted({tuple(c["shape"]) for c in cases.values()}))
