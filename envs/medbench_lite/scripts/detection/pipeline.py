"""Lesion detection for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import numpy as np
import pydicom
from PIL import Image
from pydicom.pixels import apply_modality_lut

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "detections_file", "n_boxes"]


def image_path(cid):
    for ext in (".png", ".dcm"):
        p = os.path.join(ROOT, "data", "images", cid + ext)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(cid)


def load_image(path):
    """The image as a float array in [0, 1]."""
    if path.endswith(".png"):
        return np.asarray(Image.open(path), dtype=np.float64) / 255.0
    ds = pydicom.dcmread(path)
    return apply_modality_lut(ds.pixel_array, ds).astype(np.float64) / 4095.0


def boxes(image):
    """Submission boxes [x0, y0, x1, y1, score]."""
    out = []
    for det in infer_lib.detect(image, W):
        r0, c0, r1, c1 = det["box_rc"]
        # The model gives (row, col) order; the submission wants x = column, y = row.
        out.append([c0, r0, c1, r1, det["score"]])
    return out


def run(ids, out_csv, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for cid in ids:
        found = boxes(load_image(image_path(cid)))
        path = os.path.join(out_dir, cid + ".json")
        with open(path, "w") as f:
            json.dump({"id": cid, "boxes": found}, f)
        rows.append({"id": cid, "detections_file": os.path.relpath(os.path.abspath(path), ROOT), "n_boxes": len(found)})
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
