"""Liver and lesion segmentation for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import nibabel as nib
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
FIELDS = ["id", "mask_file", "liver_ml", "lesion_ml"]


def predict(img):
    """Labels on the input's own voxel grid."""
    # The model wants RAS+ voxel order: reorient, segment, map the labels back.
    can = nib.as_closest_canonical(img)
    labels = infer_lib.segment(can.get_fdata(dtype=np.float32), can.header.get_zooms()[:3], W)
    back = nib.Nifti1Image(labels, can.affine).as_reoriented(nib.io_orientation(img.affine))
    assert np.allclose(back.affine, img.affine, atol=1e-4), "labels are not on the input grid"
    return np.asarray(back.dataobj, dtype=np.uint8)


def run(ids, out_csv, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for cid in ids:
        img = nib.load(os.path.join(ROOT, "data", "images", cid + ".nii.gz"))
        labels = predict(img)
        mask = nib.Nifti1Image(labels.astype(np.uint8), img.affine)
        mask.set_sform(img.affine, code=1)
        mask.set_qform(img.affine, code=1)
        path = os.path.join(out_dir, cid + ".nii.gz")
        nib.save(mask, path)
        ml = float(np.prod(img.header.get_zooms()[:3])) / 1000.0
        rows.append({"id": cid, "mask_file": os.path.relpath(os.path.abspath(path), ROOT),
                     "liver_ml": round(float((labels > 0).sum()) * ml, 1),
                     "lesion_ml": round(float((labels == 2).sum()) * ml, 1)})
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
