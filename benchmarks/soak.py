"""Soak: many envs, thousands of hostile calls, and nothing grows or breaks.

Plays randomly chosen hostile calls (escaping links, odd names, deep and wide trees,
sparse files, fork and memory bombs, background writers, unreadable messages) in 8
toy_pipeline envs round-robin, ending episodes at random, and prints:

* exceptions out of reset/step/close (must be 0);
* host figures before and after, side by side: memory available, disk used under the
  runtime dir and the bank store, open files of this process, inotify watches held by
  this process, processes on the host;
* reset p50 over the first and the last 100 resets.

    python benchmarks/soak.py                  # 8 envs, 2,000 calls
    python benchmarks/soak.py --calls 400      # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym

from bat_gym.bank import build_bank
from bat_gym.catalog import get_benchmark
from bat_gym.core.sandbox.slots import runtime_dir

FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "x"}}</tool_call>'
DEEP = "python3 -c \"import os\nfor _ in range(1200):\n    os.mkdir('d'); os.chdir('d')\""


def call(code: str, language: str = "bash") -> str:
    args = {"language": language, "code": code}
    return f"<tool_call>{json.dumps({'name': 'execute_code', 'arguments': args})}</tool_call>"


HOSTILE = [
    call("ln -sf /etc/passwd leak"),
    call("mkdir -p a/b && ln -sfn ../../.. a/b/up"),
    call("touch $'\\xff\\xfe' $'two\\nlines'"),
    call(DEEP),
    call("mkdir -p w && cd w && seq 1 9000 | xargs touch"),
    call("truncate -s 300M s1 && truncate -s 300M s2"),
    call("for i in $(seq 3000); do mkdir -p t/$i; done"),
    call("(while :; do echo x >> bg.txt; done) &"),
    call("b() { b | b & }; b; sleep 0.5"),
    call("python3 -c 'b = bytearray(3 << 30)'"),
    call("cp /bin/true t && chmod 6755 t"),
    call("mkdir -p z/y && chmod 000 z"),
    call("mkfifo f; echo ok"),
    call("print('\\udcff')", "python"),
    '<tool_call>{"name": "execute_code", "arguments": {"language": "bash", "code": "echo \\ud800"}}</tool_call>',
    "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    '<tool_call>{"name": "execute_code", "arguments": {"code": ' + "9" * 5000 + "}}</tool_call>",
    "no call at all \x00",
    call("echo fine"),
    FINISH,
]


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def _inotify_watches() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        with contextlib.suppress(OSError):
            n += Path(f"/proc/self/fdinfo/{fd}").read_text().count("inotify wd:")
    return n


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def host_figures(bank: Path) -> dict[str, float]:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return {
        "memory available, MiB": int(meminfo["MemAvailable"].split()[0]) / 1024,
        "memory of this process (RSS), MiB": _rss_mib(),
        "runtime dir on disk, MiB": _du(runtime_dir()) / 2**20,
        "bank store on disk, MiB": _du(bank / "store") / 2**20,
        "open files (this process)": len(os.listdir("/proc/self/fd")),
        "inotify watches (this process)": _inotify_watches(),
        "processes on the host": sum(1 for p in os.listdir("/proc") if p.isdigit()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="bat-soak-"))
    bank = work / "bank"
    build_bank(get_benchmark("toy_pipeline"), bank, tasks_per_track=1)
    envs = [
        gym.make("bat/E2E-v0", benchmark="toy_pipeline", states=str(bank)) for _ in range(args.envs)
    ]
    resets: list[float] = []
    exceptions: list[str] = []

    def reset(env) -> None:
        t = time.perf_counter()
        env.reset(seed=rng.randrange(1 << 30))
        resets.append(time.perf_counter() - t)

    for env in envs:
        reset(env)
    before = host_figures(bank)
    start = time.monotonic()
    for i in range(args.calls):
        env = envs[i % len(envs)]
        try:
            _, _, terminated, truncated, _ = env.step(rng.choice(HOSTILE))
            if terminated or truncated or rng.random() < 0.05:
                reset(env)
        except Exception as exc:  # noqa: BLE001 - counting them is the point
            exceptions.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            try:
                reset(env)
            except Exception as again:  # noqa: BLE001
                exceptions.append(f"reset after it: {type(again).__name__}: {again}")
    elapsed = time.monotonic() - start
    for env in envs:  # every env back to a start state before the after figures
        reset(env)
    after = host_figures(bank)
    for env in envs:
        try:
            env.close()
        except Exception as exc:  # noqa: BLE001
            exceptions.append(f"close: {type(exc).__name__}: {exc}")

    print(f"{args.calls} hostile calls in {args.envs} envs, {elapsed:.0f} s")
    print(f"exceptions out of reset/step/close: {len(exceptions)}")
    for e in exceptions[:10]:
        print("   ", e)
    print(f"{'figure':34} {'before':>10} {'after':>10}")
    for key in before:
        print(f"{key:34} {before[key]:10.1f} {after[key]:10.1f}")
    first = statistics.median(resets[:100]) * 1000
    last = statistics.median(resets[-100:]) * 1000
    print(f"{'reset p50, ms (first/last 100)':34} {first:10.2f} {last:10.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
