"""First contact on a fresh install: the first reset, ``bat-gym demo``, and the whole grid.

Every figure is taken in a new process with a new, empty bat_gym cache
(``BAT_GYM_CACHE``), as on a fresh install:

* **first reset**: ``gym.make(id)`` then ``env.reset(seed=S)``, for each ``bat/*`` id,
  timed from before ``gym.make`` (imports excluded, they are the same either way);
* **demo**: ``bat-gym demo`` run under a pseudo-terminal, as a person runs it: seconds
  until its result (the ``reward`` line) and the longest stretch with no output at all;
* **whole grid (baseline)**: :func:`bat_gym.bank.default_bank`, every teacher trajectory
  of the default grid, which is what the first reset used to build before it returned.

    python benchmarks/first_reset.py [--seeds 0 1] [--ids Validate E2E] [--no-grid]

Figures (issue 39, item 10; ``bat/Validate-v0``, seed 0, MedBench-Lite):

* before: 9.6-12.7 s on a quiet two-core machine, 3.9 s of it in the leakage gate's
  held-out index, rebuilt for each of the trajectory's 6 rows.
* after (the index built once per track and process, in a thread beside the
  trajectory's first episode): 11.4 CPU s (67.5 s wall on two cores at load 11, shared
  with four other test runs). A CPU profile of the main process (7.1 s): 2.8 s planning,
  nearly all of it MedBench-Lite regenerating the task of every track to read its
  teacher's stages (``synthesis`` fits its model's weights: 1.1 s); 2.4 s building the
  one trajectory (its 6 verifications and 5 demonstrations); 1.4 s ``gym.make``.
  Planning without generating tasks needs the benchmark to name a task's id and
  stages without its data, which the Benchmark API does not offer yet.
* then (a trajectory built for one row demonstrates that row and its E2E row, the
  others when they are first asked for): seeds 0 and 1, before -> after, measured one
  after the other at load 4.5 on two cores (another test run beside them):
  seed 0 13.2 -> 9.7 CPU s (18.7 -> 14.7 s wall); seed 1, which walks past rows that
  are not admitted, 44.4 -> 25.7 CPU s (60.0 -> 38.4 s wall).
* and (MedBench-Lite names its teacher's stages, ``Benchmark.teacher_stages``, so the
  plan generates no task): seed 0 9.7 -> 6.1 CPU s, seed 1 25.7 -> 21.7 CPU s, at load
  5.4 (wall times at that load, 15 s and 34 s, say little).
* and (a reproduction starts without ``Benchmark.reproduction_omits``, so MedBench-Lite's
  S3 notes cost no new run; a failure trajectory's E2E row waits until it is asked for;
  its reference run plays beside it), on an idle two-core machine, ``--ids Validate
  Plan --seeds 0 1 2 3``: Validate seed 0 8.7 -> 3.8 s, seed 1 21.5 -> 9.8 s; success
  rows 3.4-3.8 s, other rows 3.7-13.2 s (enhancement's volumes the slowest), median 5.6 s.
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IDS = ("Plan", "Setup", "Validate", "Infer", "Submit", "E2E")

_RESET = """
import resource, sys, time
import gymnasium as gym

def cpu():
    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in use)

t, c = time.perf_counter(), cpu()
env = gym.make(sys.argv[1], **({"benchmark": sys.argv[3]} if sys.argv[3] else {}))
_, info = env.reset(seed=int(sys.argv[2]))
wall = time.perf_counter() - t
env.close()  # its sandboxes' processes are reaped here, and their CPU counted
print(f"{wall:.3f} {cpu() - c:.3f} {info['state_id']}")
"""

_GRID = """
import sys, time
from bat_gym.bank import default_bank
from bat_gym.catalog import get_benchmark
bench = get_benchmark(sys.argv[1] or None)
t = time.perf_counter()
bank = default_bank(bench, workers=int(sys.argv[2]))
print(f"{time.perf_counter() - t:.3f} {len(bank)}")
"""


def _fresh_env(tmp: str, benchmark: str | None) -> dict[str, str]:
    env = {**os.environ, "BAT_GYM_CACHE": tmp}
    if benchmark:
        env["BAT_GYM_BENCHMARK"] = benchmark
    return env


def first_reset(env_id: str, seed: int, benchmark: str | None) -> tuple[float, float, str]:
    """Seconds of ``gym.make`` + the first ``reset`` on a fresh cache, its CPU seconds, state.

    The CPU seconds (this process and its sandboxes') hardly move with the machine's
    load, where the wall-clock seconds do: on a shared machine compare those.
    """
    with tempfile.TemporaryDirectory(prefix="bat-fresh-") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", _RESET, env_id, str(seed), benchmark or ""],
            env=_fresh_env(tmp, benchmark),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    return float(out[0]), float(out[1]), out[2]


def demo(benchmark: str | None, timeout_s: float = 300) -> tuple[float, float, str]:
    """``bat-gym demo`` on a pseudo-terminal: seconds to its result, longest silence, state."""
    bat_gym = Path(sys.executable).with_name("bat-gym")
    with tempfile.TemporaryDirectory(prefix="bat-fresh-") as tmp:
        master, slave = pty.openpty()
        start = time.perf_counter()
        proc = subprocess.Popen(
            [str(bat_gym), "demo"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**_fresh_env(tmp, benchmark), "COLUMNS": "120"},
        )
        os.close(slave)
        last, longest, result_at, text = start, 0.0, None, b""
        try:
            while time.perf_counter() - start < timeout_s:
                ready, _, _ = select.select([master], [], [], 0.5)
                now = time.perf_counter()
                if not ready:
                    if proc.poll() is not None:
                        break
                    continue
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other end closed
                    break
                if not chunk:
                    break
                longest = max(longest, now - last)
                last = now
                text += chunk
                if result_at is None and b"\nreward " in text:
                    result_at = now - start
        finally:
            proc.wait(timeout=60)
            os.close(master)
    if proc.returncode != 0 or result_at is None:
        raise SystemExit(f"bat-gym demo failed (exit {proc.returncode}):\n{text.decode()[-2000:]}")
    state = text.split(b": state ", 1)[1].split(b" ", 1)[0].decode()
    return result_at, longest, state


def whole_grid(benchmark: str | None, workers: int) -> tuple[float, int]:
    """Seconds to build the whole default grid on a fresh cache, and its states."""
    with tempfile.TemporaryDirectory(prefix="bat-fresh-") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", _GRID, benchmark or "", str(workers)],
            env=_fresh_env(tmp, benchmark),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default=None, help="default: the default benchmark")
    parser.add_argument("--ids", nargs="+", default=list(IDS), choices=IDS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--no-demo", action="store_true")
    parser.add_argument("--no-grid", action="store_true", help="skip the whole-grid baseline")
    parser.add_argument("--workers", type=int, default=1, help="workers of the whole grid")
    args = parser.parse_args()

    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}\n")
    print(f"{'first reset on a fresh cache':<34}{'seed':>5}{'seconds':>9}{'CPU s':>9}  state")
    times, cpus = [], []
    for name in args.ids:
        for seed in args.seeds:
            seconds, cpu, state = first_reset(f"bat/{name}-v0", seed, args.benchmark)
            times.append(seconds)
            cpus.append(cpu)
            print(f"{f'bat/{name}-v0':<34}{seed:>5}{seconds:>9.2f}{cpu:>9.2f}  {state}", flush=True)
    print(
        f"{'  median / max':<39}{statistics.median(times):>9.2f} / {max(times):.2f}"
        f"   CPU {statistics.median(cpus):.2f} / {max(cpus):.2f}\n",
        flush=True,
    )
    if not args.no_demo:
        result_s, silent_s, state = demo(args.benchmark)
        print(
            f"{'bat-gym demo on a fresh cache':<34}{'':>5}{result_s:>9.2f}  result printed ({state})"
        )
        print(f"{'  longest stretch without output':<39}{silent_s:>9.2f}\n", flush=True)
    if not args.no_grid:
        seconds, n = whole_grid(args.benchmark, args.workers)
        print(
            f"{'whole default grid (baseline)':<34}{'':>5}{seconds:>9.2f}  {n} states, "
            f"{args.workers} worker(s): what the first reset built before"
        )


if __name__ == "__main__":
    main()
