"""S2: the model on a flat image."""

import numpy as np
flat = np.full((64, 64), 800.0)
label, p = infer_lib.classify(flat, W)
smoke = {"input": "flat 64x64 image at 800", "label": label, "p_opacity": round(p, 4)}
