"""The verifier's reproduction: the shipped ``pipeline/infer.py`` run on every case, as S4.

Run by :func:`~bat_gym.envs.medbench_lite.agreement.reproduction_command` in a fresh
sandbox holding the agent's final workspace. Slots: ``SLOT_IDS`` (the task's case ids,
a list) and ``SLOT_OUT_DIR`` (the track's per-case output directory, a string).
"""

import importlib.util, os, sys

root = os.getcwd()
# Only what the pipeline declares: its own folder (it adds model/ itself), then the
# interpreter's. Not the workspace root, where a module beside the pipeline could stand
# in for one it imports (python3 -I already leaves out '' and PYTHONPATH).
sys.path[:0] = [os.path.join(root, "pipeline")]
spec = importlib.util.spec_from_file_location("infer", os.path.join(root, "pipeline", "infer.py"))
infer = importlib.util.module_from_spec(spec)
sys.modules["infer"] = infer
spec.loader.exec_module(infer)
# The case ids and the output directory are the task's, not read from the workspace.
infer.run(SLOT_IDS, "outputs/predictions.csv", SLOT_OUT_DIR)
