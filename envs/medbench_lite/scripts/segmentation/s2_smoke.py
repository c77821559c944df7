"""S2: the model on an 8x8x8 block phantom."""

import numpy as np
toy = np.full((8, 8, 8), -90.0, dtype=np.float32)
toy[4:, 2:6, 2:6] = 60.0
lab = infer_lib.segment(toy, (5.0, 5.0, 5.0), W)
smoke = {"input": "8x8x8 block phantom", "labels": sorted(int(v) for v in np.unique(lab)),
         "liver_voxels": int((lab == 1).sum())}
