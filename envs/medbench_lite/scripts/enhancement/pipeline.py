"""Low-dose CT denoising for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import nibabel as nib
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "output_file"]


def denoise_hu(hu):
    """Restored slices (artifact and noise removed), in HU."""
    # The edge mask, artifact fit and TV weight are tuned for the normalized window, not for HU.
    return infer_lib.from_unit(infer_lib.denoise(infer_lib.to_unit(hu, W), W), W)


def run(ids, out_csv, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for cid in ids:
        img = nib.load(os.path.join(ROOT, "data", "images", cid + ".nii.gz"))
        out = nib.Nifti1Image(denoise_hu(img.get_fdata()).astype(np.float32), img.affine)
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
