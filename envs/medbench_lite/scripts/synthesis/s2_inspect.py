"""S2: every volume's shape, 99.5th percentile and orientation; the training pairs."""

import glob
import nibabel as nib
import numpy as np
cases = {}
for p in sorted(glob.glob("data/train/*.nii.gz")) + [f"data/test/{i}_A.nii.gz" for i in case_ids]:
    img = nib.load(p)
    a = img.get_fdata()
    cases[os.path.basename(p)] = {"shape": list(img.shape), "p99_5": round(float(np.percentile(a, 99.5)), 1),
                                  "axcodes": "".join(nib.aff2axcodes(img.affine))}
pairs = sorted({os.path.basename(p).rsplit("_", 1)[0] for p in glob.glob("data/train/*_B.nii.gz")})
compat = {"input_format": "NIfTI-1 .nii.gz", "readable": len(cases), "test_cases": len(case_ids), "training_pairs": pairs,
          "volumes": cases, "model_input": "contrast A / 95th percentile of the foreground (model card)"}
print(len(cases), "volumes readable;", len(pairs), "training pairs:", pairs)
print("99.5th percentiles (scanner units):", {k: v["p99_5"] for k, v in cases.items()})
