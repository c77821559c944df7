"""What ``import bat_gym`` (and the command line, and the policies) pull in: no ML stack.

The time it takes is reported by ``benchmarks/import_cost.py``, not asserted here: a
shared test machine's timings are noise.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "ray", "vllm", "datasets", "trl", "docker", "verl")
"""Optional and costly: only the code that uses one imports it."""


@pytest.mark.parametrize("module", ["bat_gym", "bat_gym.cli", "bat_gym.policies"])
def test_importing_loads_none_of_the_heavy_packages(module):
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = json.loads(proc.stdout)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], f"import {module} loads {heavy}"
    assert module in loaded
