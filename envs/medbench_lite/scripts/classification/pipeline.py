"""Opacity classification for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import numpy as np
import pydicom
from pydicom.pixels import apply_modality_lut

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "label", "confidence", "p_opacity"]


def model_input(path):
    """The image as the model wants it."""
    ds = pydicom.dcmread(path)
    values = apply_modality_lut(ds.pixel_array, ds).astype(np.float64)
    if ds.PhotometricInterpretation == "MONOCHROME1":
        values = float(W["full_scale"]) - values  # stored inverted: high = dark
    return values


def run(ids, out_csv, out_dir=None):
    rows = []
    for cid in ids:
        label, p = infer_lib.classify(model_input(os.path.join(ROOT, "data", "images", cid + ".dcm")), W)
        rows.append({"id": cid, "label": label, "confidence": round(float(max(p, 1 - p)), 4), "p_opacity": round(float(p), 4)})
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
