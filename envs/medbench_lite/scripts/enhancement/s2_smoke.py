"""S2: the model on flat, noisy normalized slices."""

import numpy as np
rng = np.random.default_rng(0)
flat = infer_lib.to_unit(40 + rng.normal(0, 40, (32, 32)), W)
out = infer_lib.denoise(flat, W)
smoke = {"input": "32x32 flat 40 HU, noise 40 HU (normalized)", "std_in_hu": round(float(infer_lib.from_unit(flat, W).std()), 1),
         "std_out_hu": round(float(infer_lib.from_unit(out, W).std()), 1)}
