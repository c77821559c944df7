"""How fast ``bat-gym view`` answers on large runs.

Builds, in a temporary folder:

* a **70-cell evaluation** of MedBench-Lite size (7 tracks x 10 repeats): a real
  toy_pipeline evaluation by the scripted teacher, its cells and traces copied to 70
  keys (each trace padded with tool output to ``--trace-kb`` KiB, about a long
  model episode);
* a **10,000-episode GRPO log**: ``metrics.jsonl`` of 1,250 steps and
  ``rollouts/step_NNNNNN.jsonl`` with 8 kept rollouts each, in the format the trainer
  writes (:mod:`bat_gym.trainers.rollout_log`).

Then times, over HTTP against the served viewer (127.0.0.1), a first load of each page
in a fresh server (nothing cached) and the median of ``--repeats`` later loads: the
index, the evaluation overview, one episode, the comparison of two 70-cell
evaluations, the GRPO overview, one of its step pages and one rollout. It also reports
the bytes of the GRPO log, to show a page reads one step file of it.

    python benchmarks/viewer_speed.py [--repeats 5] [--trace-kb 200]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bat_gym.evaluation import EvalConfig, evaluate
from bat_gym.policies import make_policy
from bat_gym.viewer import Site, make_server

TRACKS = [f"track{i}" for i in range(7)]


def build_eval(src: Path, out: Path, trace_kb: int) -> None:
    """70 cells and traces from the ones in ``src`` (renamed to 7 tracks x 10 repeats)."""
    shutil.copytree(src, out)
    cell = json.loads(next((src / "cells").glob("*.json")).read_text())
    trace = json.loads(next((src / "episodes").glob("*.json")).read_text())
    pad = "x" * 1000 + "\n"
    trace["record"]["calls"][0]["output"] += pad * trace_kb
    for p in [*(out / "cells").glob("*.json"), *(out / "episodes").glob("*.json")]:
        p.unlink()
    report = json.loads((src / "report.json").read_text())
    cells = []
    for t in TRACKS:
        for r in range(10):
            c = {**cell, "cell": {"track": t, "seed": 1000 + r, "repeat": r}}
            key = f"{t}-{1000 + r}-r{r}"
            (out / "cells" / f"{key}.json").write_text(json.dumps(c))
            (out / "episodes" / f"{key}.json").write_text(json.dumps(trace))
            cells.append(c)
    report["cells"] = cells
    (out / "report.json").write_text(json.dumps(report))


def build_grpo(src_trace: dict, out: Path, steps: int = 1250, per_step: int = 8) -> int:
    """A GRPO run directory with ``steps * per_step`` kept rollouts; returns the log's bytes."""
    (out / "rollouts").mkdir(parents=True)
    with (out / "metrics.jsonl").open("w") as f:
        for s in range(1, steps + 1):
            f.write(
                json.dumps({"step": s, "reward": (s % 97) / 97, "loss": 0.1, "turns": 5.0}) + "\n"
            )
    size = 0
    for s in range(1, steps + 1):
        lines = []
        for i in range(per_step):
            lines.append(json.dumps({**src_trace, "step": s, "index": i, "group": i // 2,
                                     "pool": "target", "stop_reason": "terminated"}) + "\n")  # fmt: skip
        data = "".join(lines)
        (out / "rollouts" / f"step_{s:06d}.jsonl").write_text(data)
        size += len(data)
    return size


def timed_get(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url) as r:
        r.read()
        assert r.status == 200, url
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trace-kb", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bat-gym-viewer-speed-") as tmp:
        root = Path(tmp)
        evaluate("toy_pipeline", make_policy("teacher"), root / "src",
                 EvalConfig(repeats=1, progress=False))  # fmt: skip
        build_eval(root / "src", root / "eval-a", args.trace_kb)
        build_eval(root / "src", root / "eval-b", args.trace_kb)
        trace = json.loads(next((root / "src" / "episodes").glob("*.json")).read_text())
        log_bytes = build_grpo(trace, root / "grpo")
        t0 = time.perf_counter()
        site = Site([root / "eval-a", root / "eval-b", root / "grpo"])
        load_s = time.perf_counter() - t0
        server = make_server(site)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        pages = {
            "index": "index.html",
            "evaluation overview (70 cells)": "r0.html",
            "episode": "r0-ep-track3-1005-r5.html",
            "compare 70 paired cells": "r0-vs-r1.html",
            "GRPO overview (1,250 steps)": "r2.html",
            "GRPO overview, page 13": "r2-p13.html",
            "GRPO step page": "r2-step-777.html",
            "GRPO rollout": "r2-step-777-3.html",
        }
        print(f"runs opened in {load_s * 1000:.1f} ms; GRPO log: 10,000 rollouts, "
              f"{log_bytes / 1e6:.1f} MB in 1,250 step files")  # fmt: skip
        print(f"{'page':34s} {'first load':>11s} {'median':>9s} {'size':>9s}")
        for name, path in pages.items():
            first = timed_get(f"{base}/{path}")
            rest = [timed_get(f"{base}/{path}") for _ in range(args.repeats)]
            size = len(site.get(path)[0])
            print(f"{name:34s} {first * 1000:9.1f} ms {statistics.median(rest) * 1000:6.1f} ms "
                  f"{size / 1024:7.0f} KiB")  # fmt: skip
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
