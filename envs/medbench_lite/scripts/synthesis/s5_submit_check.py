"""S5: every output lies on its input's grid (shape and affine)."""

import nibabel as nib
import numpy as np
for r in rows:
    img = nib.load(f"data/test/{r['id']}_A.nii.gz")
    out = nib.load(r["output_file"])
    if out.shape != img.shape or not np.allclose(out.affine, img.affine, atol=1e-3):
        problems.append(r["id"] + ": output grid differs from the input")
