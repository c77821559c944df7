"""S2: the model on a toy chest with one 8 mm nodule, 2 mm voxels."""

import numpy as np
v = np.full((40, 40, 20), 40.0)
v[5:18, 8:32, 2:18] = -850.0
v[22:35, 8:32, 2:18] = -850.0
v[9:13, 18:22, 8:12] = 30.0
found = infer_lib.find_nodules(v, W, spacing=(2.0, 2.0, 2.0))
smoke = {"input": "toy chest 40x40x20, 2 mm voxels, one 8 mm cube nodule", "findings": found}
