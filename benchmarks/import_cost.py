"""How long ``import bat_gym`` takes, and what else the same import loads.

Times ``python -c "import bat_gym"`` against ``python -c pass`` over interleaved runs
(the difference is the import), for the package, for Gymnasium alone (which bat_gym
imports to register its env ids, with NumPy: most of the cost) and for the command
line, and prints medians of wall time and of CPU time (user + system, which a busy
machine inflates less), then the slowest modules of one ``-X importtime`` run.
Target: under 0.3 s for ``import bat_gym``. ``tests/test_import.py`` asserts the module
set: no torch, transformers or ray.

    python benchmarks/import_cost.py [--runs 15] [--top 8]
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3
CASES = ("pass", "import gymnasium", "import bat_gym", "import bat_gym.cli")


def _cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run_s(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -c code``."""
    t, c = time.perf_counter(), _cpu_s()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t, _cpu_s() - c


def _slowest(module: str, top: int) -> list[tuple[float, str]]:
    """The ``top`` modules with the largest cumulative import time, in seconds."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    rows = []
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(2)) <= 3:  # the module itself and what it imports directly
            rows.append((int(m.group(1)) / 1e6, m.group(3)))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    wall: dict[str, list[float]] = {c: [] for c in CASES}
    cpu: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(args.runs):  # interleaved, so machine load hits every case alike
        for case in CASES:
            w, c = _run_s(case)
            wall[case].append(w)
            cpu[case].append(c)
    w0, c0 = statistics.median(wall["pass"]), statistics.median(cpu["pass"])
    print(f"{'python -c ...':<24}{'wall s':>8}{'cpu s':>8}{'import wall':>13}{'import cpu':>12}")
    for case in CASES:
        w, c = statistics.median(wall[case]), statistics.median(cpu[case])
        print(f"{case:<24}{w:>8.3f}{c:>8.3f}{w - w0:>13.3f}{c - c0:>12.3f}")
    cost = statistics.median(wall["import bat_gym"]) - w0
    verdict = "ok" if cost < TARGET_S else "over (a busy machine inflates wall time: see cpu)"
    print(f"import bat_gym: {cost:.3f} s wall, target < {TARGET_S} s: {verdict}")
    for module in ("bat_gym", "bat_gym.cli"):
        print(f"\nslowest imports under `import {module}` (cumulative s, one run):")
        for seconds, name in _slowest(module, args.top):
            print(f"  {seconds:8.3f}  {name}")


if __name__ == "__main__":
    main()
