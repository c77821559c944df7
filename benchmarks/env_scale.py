"""How local sandboxes scale: memory, cold start, reset and step at 1 to 1,000 envs.

For each count N it starts N local sandboxes in this process, one after another, and
measures, in one run:

* cold start: from ``make_sandbox`` to the end of the first ``restore`` (what the first
  ``reset`` of a new env pays), p50 and p99 over the N envs;
* memory per env: the proportional set size (PSS, ``/proc/PID/smaps_rollup``) of each
  sandbox's processes (the process tree under each sandbox's ``bwrap``), mean over envs;
  PSS splits a shared page among the processes that map it, so the sum over envs is
  what the envs cost together;
* idle CPU: CPU seconds used by all sandbox processes over two idle seconds;
* reset and step p50: a restore, and one ``bash: true`` call, on every env in turn.

Baseline: the figures measured before this work (the scale issue's table), printed
beside each measurement with the target.

Usage: python benchmarks/env_scale.py [--envs 1 10 100 1000]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from bat_gym.core.sandbox import BlobStore, WorkspaceIndex, make_sandbox

# Measured before (local backend, 64 envs, this machine): see the table.
BASELINE = {"pss_mb": 19.5, "cold_p50_ms": 107.0}
TARGET = {"pss_mb": 8.0, "cold_p50_ms": 50.0, "idle_cpu_s": 0.0}


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (0 < q <= 100)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads')."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children(p)
    return seen


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def workspace(tmp: Path, store: BlobStore):
    """A small task workspace: 20 files, 200 KiB."""
    src = tmp / "seed"
    for i in range(20):
        p = src / f"d{i // 5}" / f"f{i:02d}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(10 * 1024))
    return WorkspaceIndex(src).capture(store)


def measure(n: int, tmp: Path) -> dict[str, float]:
    store = BlobStore(tmp / f"store-{n}")
    snap = workspace(tmp / f"ws-{n}", store)
    before = set(children(os.getpid()))
    boxes, cold = [], []
    try:
        for i in range(n):
            start = time.perf_counter()
            sb = make_sandbox("local", store=store)
            sb.restore(snap)
            cold.append((time.perf_counter() - start) * 1e3)
            boxes.append(sb)
            if (i + 1) % 100 == 0:
                print(f"... {i + 1}/{n} envs started", file=sys.stderr, flush=True)
        roots = [p for p in children(os.getpid()) if p not in before]
        trees = [tree(r) for r in roots]
        pss = [sum(pss_kb(p) for p in t) / 1024 for t in trees]
        every = [p for t in trees for p in t]
        c0 = cpu_s(every)
        time.sleep(2.0)
        idle = cpu_s(every) - c0
        gc.collect()
        resets, steps = [], []
        for sb in boxes:
            t0 = time.perf_counter()
            sb.restore(snap)
            resets.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            r = sb.execute_code("bash", "true")
            steps.append((time.perf_counter() - t0) * 1e3)
            if r.exit_code != 0:
                raise RuntimeError(f"a step failed: {r}")
    finally:
        for sb in boxes:
            sb.close()
    return {
        "envs": n,
        "processes_per_env": len(every) / max(1, len(trees)),
        "pss_mb": sum(pss) / max(1, len(pss)),
        "cold_p50_ms": percentile(cold, 50),
        "cold_p99_ms": percentile(cold, 99),
        "idle_cpu_s": idle,
        "reset_p50_ms": percentile(resets, 50),
        "step_p50_ms": percentile(steps, 50),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 10, 100])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bat-gym-scale-") as tmp:
        for n in args.envs:
            print(f"... {n} envs", file=sys.stderr, flush=True)
            rows.append(measure(n, Path(tmp)))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    head = ("envs", "proc/env", "PSS MB/env", "cold p50 ms", "cold p99 ms", "idle CPU s")
    print("| " + " | ".join(head + ("reset p50 ms", "step p50 ms")) + " |")
    print("|" + "---|" * (len(head) + 2))
    for r in rows:
        print(
            f"| {r['envs']} | {r['processes_per_env']:.1f} | {r['pss_mb']:.1f} | "
            f"{r['cold_p50_ms']:.0f} | {r['cold_p99_ms']:.0f} | {r['idle_cpu_s']:.2f} | "
            f"{r['reset_p50_ms']:.1f} | {r['step_p50_ms']:.2f} |"
        )
    last = rows[-1]
    print()
    print("| figure | before | now | ratio now/before | target |")
    print("|---|---|---|---|---|")
    for key in ("pss_mb", "cold_p50_ms"):
        print(
            f"| {key} | {BASELINE[key]:g} | {last[key]:.1f} | {last[key] / BASELINE[key]:.2f}x "
            f"| <= {TARGET[key]:g} |"
        )
    print(f"| idle_cpu_s | - | {last['idle_cpu_s']:.2f} | - | {TARGET['idle_cpu_s']:g} |")


if __name__ == "__main__":
    main()
