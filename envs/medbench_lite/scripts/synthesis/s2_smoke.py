"""S2 of the synthesis track: run the model once on a tiny input.

Spliced into the teacher's setup script after the model is loaded: it gives
``infer_lib`` (``model/infer_lib.py``) and ``W`` (its weights). Sets ``smoke``, a
JSON-able dict the script records in ``setup/model_load.json``.
"""

import numpy as np
probe = np.array([0.05, 0.3, 0.65, 1.0])
smoke = {"input": "normalized A values " + str(probe.tolist()), "output": [round(float(v), 3) for v in infer_lib.predict(probe, W)]}
