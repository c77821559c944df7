"""The ``receipt()`` helper every receipt-writing stage script begins with (``SLOT_RECEIPT``).

A receipt is a stage's JSON record: the artifact's real sha256 plus what the stage
checked. This file is sent whole (its docstring aside).
"""

import hashlib, json, os

def receipt(stage, artifact, path, **extra):
    """Write a stage receipt: the artifact's real sha256 plus what the stage checked."""
    digest = hashlib.sha256(open(artifact, "rb").read()).hexdigest()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"schema_version": 1, "stage": stage, "artifact": artifact,
                   "sha256": digest, **extra}, f, indent=2,
                  default=lambda o: o.item() if hasattr(o, "item") else str(o))
