"""S2 of the classification track: run the model once on a tiny input.

Spliced into the teacher's setup script after the model is loaded: it gives
``infer_lib`` (``model/infer_lib.py``) and ``W`` (its weights). Sets ``smoke``, a
JSON-able dict the script records in ``setup/model_load.json``.
"""

import numpy as np
flat = np.full((64, 64), 800.0)
label, p = infer_lib.classify(flat, W)
smoke = {"input": "flat 64x64 image at 800", "label": label, "p_opacity": round(p, 4)}
