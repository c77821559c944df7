"""S2: record the environment and the inputs, pin the model and smoke-test it.

Slots: ``SLOT_RECEIPT`` (``receipt.py``), ``SLOT_INSPECT`` (the track's
``s2_inspect.py``, which sets ``compat``) and ``SLOT_SMOKE`` (its ``s2_smoke.py``, which
sets ``smoke``). Writes setup/environment.json, setup/compatibility.json,
model/checkpoint.json and setup/model_load.json.
"""

import importlib, json, os, platform, sys
SLOT_RECEIPT

os.makedirs("setup", exist_ok=True)
versions = {}
for name in ("numpy", "nibabel", "pydicom", "PIL"):
    try:
        versions[name] = importlib.import_module(name).__version__
    except ImportError:
        versions[name] = None
with open("setup/environment.json", "w") as f:
    json.dump({"schema_version": 1, "stage": "S2", "python": platform.python_version(),
               "packages": versions, "device": "cpu"}, f, indent=2)
print("packages:", versions)

task = json.load(open("task.json"))
case_ids = task["submission"]["case_ids"]
SLOT_INSPECT
with open("setup/compatibility.json", "w") as f:
    json.dump({"schema_version": 1, "stage": "S2", **compat}, f, indent=2)

receipt("S2", "model/weights.npz", "model/checkpoint.json",
        card="model/MODEL_CARD.md", entry_point="model/infer_lib.py")
sys.path.insert(0, "model")
import infer_lib
W = infer_lib.load("model/weights.npz")
SLOT_SMOKE
receipt("S2", "model/weights.npz", "setup/model_load.json",
        loaded=True, parameters=sorted(W), smoke_test=smoke)
print("model loaded:", sorted(W), "| smoke test:", smoke)
