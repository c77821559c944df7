"""S2: the model on one bright disk at a known row and column."""

import numpy as np
toy = np.full((48, 48), 0.3)
rr, cc = np.mgrid[:48, :48]
toy[(rr - 10) ** 2 + (cc - 30) ** 2 <= 25] = 0.8
dets = infer_lib.detect(toy, W)
smoke = {"input": "48x48, one disk at row 10, col 30", "detections": dets}
