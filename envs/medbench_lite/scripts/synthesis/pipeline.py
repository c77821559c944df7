"""MR contrast A -> B for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import nibabel as nib
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "output_file"]


def a_path(cid):
    """Test cases live in data/test, training pairs (for validation) in data/train."""
    for sub in ("test", "train"):
        p = os.path.join(ROOT, "data", sub, cid + "_A.nii.gz")
        if os.path.exists(p):
            return p
    raise FileNotFoundError(cid)


def synthesize(a):
    # The lookup table was fitted on foreground-normalized intensities.
    a_norm, _ = infer_lib.normalize(a, W)
    return infer_lib.predict(a_norm, W)


def run(ids, out_csv, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for cid in ids:
        img = nib.load(a_path(cid))
        out = nib.Nifti1Image(synthesize(img.get_fdata()).astype(np.float32), img.affine)
        out.set_sform(img.affine, code=1)
        out.set_qform(img.affine, code=1)
        path = os.path.join(out_dir, cid + ".nii.gz")
        nib.save(out, path)
        rows.append({"id": cid, "output_file": os.path.relpath(os.path.abspath(path), ROOT)})
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
