"""S3: on a volume not stored in RAS+, the liver lies on the patient's right, 0.4-1.5 L."""

import nibabel as nib
import numpy as np
# Pilot the riskiest case: one whose voxel axes are not in RAS+ order.
codes = {i: "".join(nib.aff2axcodes(nib.load(f"data/images/{i}.nii.gz").affine)) for i in case_ids}
case_id = next((i for i in case_ids if codes[i] != "RAS"), case_ids[0])
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
img = nib.load(f"data/images/{case_id}.nii.gz")
mask = nib.load(rows[0]["mask_file"])
lab = np.asarray(mask.dataobj)
liver = lab > 0
world_x = lambda m: float(nib.affines.apply_affine(img.affine, np.argwhere(m))[:, 0].mean())
side = world_x(liver) - world_x(img.get_fdata() > -500) if liver.any() else float("nan")
litres = float(liver.sum() * np.prod(img.header.get_zooms()[:3]) / 1e6)
print("pilot case", case_id, "stored as", codes[case_id])
checks = {
    "mask on input grid": {"value": bool(lab.shape == img.shape and np.allclose(mask.affine, img.affine, atol=1e-3)),
                           "expect": True, "ok": bool(lab.shape == img.shape and np.allclose(mask.affine, img.affine, atol=1e-3))},
    "liver centre minus body centre, world x (mm; RAS +x = patient's right)": {
        "value": round(side, 1), "expect": "> 20", "ok": bool(side > 20)},
    "liver volume (L)": {"value": round(litres, 2), "expect": "0.4-1.5", "ok": bool(0.4 <= litres <= 1.5)},
}
# The receipt states this check: its figure is what the verifier recomputes.
figure = ('liver_side_mm', "liver centre minus body centre, world x (mm; RAS +x = patient's right)")
