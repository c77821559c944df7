"""S2: the lookup table on a few normalized contrast-A values."""

import numpy as np
probe = np.array([0.05, 0.3, 0.65, 1.0])
smoke = {"input": "normalized A values " + str(probe.tolist()), "output": [round(float(v), 3) for v in infer_lib.predict(probe, W)]}
