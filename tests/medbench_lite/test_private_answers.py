"""The private answers of a task cannot be reached from inside its sandbox."""

from __future__ import annotations

import json
import os
from pathlib import Path

import bat_gym
from bat_gym.bank import cache_dir
from bat_gym.core.sandbox import make_sandbox
from bat_gym.envs import medbench_lite
from bat_gym.envs.medbench_lite import MedBenchLite

PROBE = """
import importlib, json, os
found = {}
for path in PATHS:
    found[path] = os.path.exists(path)
for mod in ("bat_gym", "bat_gym.envs.medbench_lite"):
    try:
        importlib.import_module(mod)
        found[mod] = True
    except ImportError:
        found[mod] = False
print(json.dumps(found))
"""


def test_an_agent_cannot_reach_answers_generators_or_banks():
    bench = MedBenchLite()
    task = bench.make_task("classification", next(iter(bench.seeds("heldout"))), "heldout")
    # Answers exist only in the host process: computed from the seed by the generator,
    # or read back from the bank's store. Neither is reachable from inside.
    assert bench.private_answers(task)
    # Only the Python environment is bound inside; its parents exist as bare mount points.
    paths = [
        str(cache_dir()),
        os.path.expanduser("~/.cache"),
        str(Path(bat_gym.__file__).parent),
        str(Path(medbench_lite.__file__).parent),
    ]
    with make_sandbox("local") as sb:
        bench.write_public_files(task, sb.workspace)
        r = sb.execute_code("python", f"PATHS = {paths!r}\n{PROBE}")
        assert r.exit_code == 0, r.output
        found = json.loads(r.output.strip().splitlines()[-1])
        assert not any(found.values()), found
        # What the agent can see of the task is exactly its public files.
        seen = sb.execute_code("bash", "cd /workspace && find . -type f | sort").output.split()
        public = sorted(
            f"./{p.relative_to(sb.workspace)}" for p in sb.workspace.rglob("*") if p.is_file()
        )
        assert seen == public
