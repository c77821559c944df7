"""S3, weak: the first case's mask has the image's shape and labels 0-2."""

import nibabel as nib
import numpy as np
case_id = case_ids[0]
rows = infer.run([case_id], "validation/pilot.csv", "validation/pilot")
img = nib.load(f"data/images/{case_id}.nii.gz")
lab = np.asarray(nib.load(rows[0]["mask_file"]).dataobj)
checks = {"mask shape equals image shape": {"value": list(lab.shape), "expect": list(img.shape), "ok": lab.shape == img.shape},
          "labels within {0,1,2}": {"value": sorted(int(v) for v in np.unique(lab)), "expect": "subset of [0, 1, 2]",
                                    "ok": set(np.unique(lab).tolist()) <= {0, 1, 2}}}
