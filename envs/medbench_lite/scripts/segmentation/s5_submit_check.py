"""S5: every mask lies on its input's grid (shape and affine)."""

import nibabel as nib
import numpy as np
for r in rows:
    img = nib.load(f"data/images/{r['id']}.nii.gz")
    m = nib.load(r["mask_file"])
    if m.shape != img.shape or not np.allclose(m.affine, img.affine, atol=1e-3):
        problems.append(r["id"] + ": mask grid differs from the input")
