"""S5 of the synthesis track: check the submission rows before they are written.

Spliced into the teacher's submit script, which gives ``rows`` (the submission rows
in case order) and ``problems`` (a list) and has imported ``json``. Appends what is
wrong to ``problems``; the script refuses to submit when it is not empty.
"""

import nibabel as nib
import numpy as np
for r in rows:
    img = nib.load(f"data/test/{r['id']}_A.nii.gz")
    out = nib.load(r["output_file"])
    if out.shape != img.shape or not np.allclose(out.affine, img.affine, atol=1e-3):
        problems.append(r["id"] + ": output grid differs from the input")
