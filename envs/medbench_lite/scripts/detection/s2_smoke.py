"""S2 of the detection track: run the model once on a tiny input.

Spliced into the teacher's setup script after the model is loaded: it gives
``infer_lib`` (``model/infer_lib.py``) and ``W`` (its weights). Sets ``smoke``, a
JSON-able dict the script records in ``setup/model_load.json``.
"""

import numpy as np
toy = np.full((48, 48), 0.3)
rr, cc = np.mgrid[:48, :48]
toy[(rr - 10) ** 2 + (cc - 30) ** 2 <= 25] = 0.8
dets = infer_lib.detect(toy, W)
smoke = {"input": "48x48, one disk at row 10, col 30", "detections": dets}
