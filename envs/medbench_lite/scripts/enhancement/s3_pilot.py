"""S3: on the first stack, the noise drops and the mean HU holds, on the input grid."""

import nibabel as nib
import numpy as np
def noise_hu(a, body):
    d = np.diff(a, axis=1)[body[:, 1:] & body[:, :-1]]
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
img = nib.load(f"data/images/{case_id}.nii.gz")
hu = img.get_fdata()
out_img = nib.load(rows[0]["output_file"])
out = out_img.get_fdata()
body = (hu > -300) & (hu < 300)
n_in, n_out = noise_hu(hu, body), noise_hu(out, body)
shift = float(out[body].mean() - hu[body].mean())
print("pilot", case_id, "noise HU in", round(n_in, 1), "out", round(n_out, 1))
checks = {
    "output on input grid": {"value": list(out.shape), "expect": list(hu.shape),
                             "ok": out.shape == hu.shape and bool(np.allclose(out_img.affine, img.affine, atol=1e-3))},
    "noise reduction factor (card: 4-8x)": {"value": round(n_in / max(n_out, 1e-6), 2), "expect": ">= 1.5", "ok": n_in / max(n_out, 1e-6) >= 1.5},
    "mean body HU shift": {"value": round(shift, 1), "expect": "|shift| < 10", "ok": abs(shift) < 10},
}
# The receipt states this check: its figure is what the verifier recomputes.
figure = ('noise_reduction', 'noise reduction factor (card: 4-8x)')
