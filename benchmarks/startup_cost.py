"""What installing bat_gym adds to every Python start in its environment.

The ``bat_gym-autoregister.pth`` hook runs at each interpreter start-up. This times
``python -c pass`` with the hook in place and with it moved aside (the baseline), over
interleaved runs, and prints medians side by side. Target: under 5 ms difference.

    python benchmarks/startup_cost.py [--runs 40]
"""

from __future__ import annotations

import argparse
import site
import statistics
import subprocess
import sys
import time
from pathlib import Path

PTH = "bat_gym-autoregister.pth"


def _start_ms() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - t) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    hooks = [Path(d) / PTH for d in site.getsitepackages() if (Path(d) / PTH).exists()]
    if not hooks:
        raise SystemExit(f"no {PTH} in {site.getsitepackages()}: is bat_gym installed here?")
    hook, aside = hooks[0], hooks[0].with_suffix(".pth-aside")
    with_hook: list[float] = []
    without: list[float] = []
    try:
        for _ in range(args.runs):  # interleaved, so machine load hits both alike
            with_hook.append(_start_ms())
            hook.rename(aside)
            try:
                without.append(_start_ms())
            finally:
                aside.rename(hook)
    finally:
        if aside.exists():
            aside.rename(hook)
    a, b = statistics.median(with_hook), statistics.median(without)
    print(f"{'python -c pass':<28}{'median ms':>10}")
    print(f"{'without the hook (baseline)':<28}{b:>10.1f}")
    print(f"{'with the hook':<28}{a:>10.1f}")
    print(f"{'difference':<28}{a - b:>10.1f}  ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
