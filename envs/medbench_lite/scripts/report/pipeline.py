"""Nodule reports for every case: run(ids, out_csv, out_dir)."""
import csv, json, os, sys

import nibabel as nib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "model"))
import infer_lib

W = infer_lib.load(os.path.join(ROOT, "model", "weights.npz"))
META = json.load(open(os.path.join(ROOT, "data", "metadata.json")))
FIELDS = ["id", "report_file", "n_findings"]


def findings(img):
    can = nib.as_closest_canonical(img)
    # Sizes come out in the units of `spacing`: pass the voxel size in mm.
    zooms = tuple(float(z) for z in can.header.get_zooms()[:3])
    return infer_lib.find_nodules(can.get_fdata(), W, spacing=zooms)


def run(ids, out_csv, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for cid in ids:
        found = findings(nib.load(os.path.join(ROOT, "data", "images", cid + ".nii.gz")))
        path = os.path.join(out_dir, cid + ".txt")
        with open(path, "w") as f:
            f.write(infer_lib.format_report(cid, found, META[cid]))
        with open(os.path.join(out_dir, cid + ".json"), "w") as f:
            json.dump(found, f, indent=1)
        rows.append({"id": cid, "report_file": os.path.relpath(os.path.abspath(path), ROOT), "n_findings": len(found)})
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


if __name__ == "__main__":
    ids = sys.argv[3:] or json.load(open(os.path.join(ROOT, "task.json")))["submission"]["case_ids"]
    run(ids, sys.argv[1], sys.argv[2])
