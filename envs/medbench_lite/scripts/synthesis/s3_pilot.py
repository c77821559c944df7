"""S3: on a training pair, the output matches the known contrast B (r, MAE)."""

import glob
import nibabel as nib
import numpy as np
# Pilot on a training pair: its contrast B is known, so quality can be measured.
case_id = sorted(os.path.basename(p)[:-9] for p in glob.glob("data/train/*_B.nii.gz"))[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
pred = nib.load(rows[0]["output_file"]).get_fdata()
b = nib.load(f"data/train/{case_id}_B.nii.gz").get_fdata()
head = b > 0.1 * np.percentile(b, 99.5)
p, g = pred[head] / max(pred[head].mean(), 1e-9), b[head] / b[head].mean()
r = float(np.corrcoef(p, g)[0, 1]) if p.std() > 0 else 0.0
nmae = float(np.abs(p - g).mean() / np.abs(g).mean())
print("pilot on training pair", case_id, "output range", round(float(pred.min()), 3), round(float(pred.max()), 3))
checks = {
    "Pearson r with the true contrast B in the head": {"value": round(r, 3), "expect": "> 0.8 (card)", "ok": r > 0.8},
    "normalized MAE in the head": {"value": round(nmae, 3), "expect": "< 0.2 (card)", "ok": nmae < 0.2},
}
# The receipt states this check: its figure is what the verifier recomputes.
figure = ('pearson_r', 'Pearson r with the true contrast B in the head')
