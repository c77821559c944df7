"""The receipt helper the S3-S5 scripts splice in (``SLOT_RECEIPT``): an artifact's sha256."""

import hashlib, json, os
def receipt(stage, artifact, path, **extra):
    digest = hashlib.sha256(open(artifact, "rb").read()).hexdigest()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump({"schema_version": 1, "stage": stage, "artifact": artifact, "sha256": digest, **extra}, open(path, "w"), indent=2)
