"""How env steps per second scale with the number of envs, per vector backend.

For 1, 2, 4, 8 and 32 envs of ``bat/E2E-v0`` (the toy_pipeline benchmark), it measures
env steps per second (vector steps x envs) of:

* ``SyncVectorEnv`` (every env in this process, stepped one after another),
* ``AsyncVectorEnv`` with spawned workers (one process per env),
* ``RayVectorEnv`` (one Ray actor per env, on a local Ray started here),

for two tool calls, each next to its ideal:

* ``sleep 0.1``, a call that mostly waits: ideal is the 1-env rate x n;
* ``true``, a trivial call whose cost is CPU (parsing, the sandbox round trip, the
  workspace digests, pickling the info): no backend can beat the 1-env rate x the
  number of CPUs, and the sync env, one process, not even the 1-env rate.

Episodes are 20 steps long (shorter than the default budgets), and only ``step`` is
timed, so the conversation carried in ``info`` stays the size it has in real episodes.

Then a head-of-line check: one env's call sleeps 1 s while the others call ``true``.
``AsyncVectorEnv.step`` returns when the slowest env does; ``RayVectorEnv.step_some``
returns each env's result as soon as it is ready, so the others keep stepping.

Usage: python benchmarks/vector_scaling.py [--sizes 1,2,4,8,32] [--modes sync,async,ray]
[--seconds 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from bat_gym import ToolCall
from bat_gym.core.protocol import get_protocol

ENV_ID = "bat/E2E-v0"
BENCHMARK = "toy_pipeline"
EPISODE_STEPS = 20
MIN_VECTOR_STEPS = 3
CALLS = {"sleep": "sleep 0.1", "true": "true"}
MODES = ("sync", "async", "ray")


def progress(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def bash(code: str) -> str:
    call = ToolCall(name="execute_code", arguments={"language": "bash", "code": code})
    return get_protocol("hermes").render("", [call])


def make_envs(mode: str, n: int, bank: Path, **env_kwargs: Any) -> gym.vector.VectorEnv:
    """A vector env of ``n`` envs on the toy benchmark, for one backend."""
    kwargs = {"benchmark": BENCHMARK, "states": str(bank), **env_kwargs}
    if mode == "sync":
        return gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="sync", **kwargs)
    if mode == "async":
        return gym.make_vec(
            ENV_ID,
            num_envs=n,
            vectorization_mode="async",
            vector_kwargs={"context": "spawn"},
            **kwargs,
        )
    from bat_gym.distributed import DEFAULT_NUM_CPUS, RayVectorEnv

    # Each env mostly waits, so n envs share the machine's CPUs in Ray's bookkeeping.
    num_cpus = min(DEFAULT_NUM_CPUS, (os.cpu_count() or 1) / n)
    return RayVectorEnv(ENV_ID, n, num_cpus=num_cpus, **kwargs)


def steps_per_s(envs: gym.vector.VectorEnv, code: str, seconds: float) -> float:
    """Env steps per second of ``code`` in every env, over ``seconds`` of timed steps."""
    n = envs.num_envs
    actions = (bash(code),) * n
    envs.reset(seed=0)
    obs, *_ = envs.step(actions)  # warm: the first call of a fresh shell
    if not all(o.startswith("[exit code 0") for o in obs):
        raise RuntimeError(f"{code!r} failed: {obs[0][:200]}")
    timed, vector_steps, in_episode = 0.0, 0, 1
    while timed < seconds or vector_steps < MIN_VECTOR_STEPS:
        if in_episode == EPISODE_STEPS:
            envs.reset()
            in_episode = 0
        start = time.perf_counter()
        envs.step(actions)
        timed += time.perf_counter() - start
        vector_steps += 1
        in_episode += 1
    return vector_steps * n / timed


def measure(modes: list[str], sizes: list[int], bank: Path, seconds: float) -> dict:
    """rates[call][mode][n] in env steps per second."""
    rates: dict[str, dict[str, dict[int, float]]] = {c: {m: {} for m in modes} for c in CALLS}
    for mode in modes:
        for n in sizes:
            progress(f"{mode}: {n} envs, starting")
            start = time.perf_counter()
            envs = make_envs(mode, n, bank)
            try:
                progress(f"{mode}: {n} envs started in {time.perf_counter() - start:.1f} s")
                for call, code in CALLS.items():
                    rates[call][mode][n] = steps_per_s(envs, code, seconds)
            finally:
                envs.close()
    return rates


def head_of_line(modes: list[str], bank: Path, n: int = 4) -> list[str]:
    """What the other envs do while one env's call sleeps 1 s."""
    # Long budgets: the fast envs make hundreds of calls while the slow one sleeps.
    from bat_gym.catalog import get_benchmark

    budgets = get_benchmark(BENCHMARK).spec.budgets.model_copy(
        update={"max_turns": 100_000, "max_tool_calls": 100_000}
    )
    lines = []
    if "async" in modes:
        progress("head of line: AsyncVectorEnv")
        envs = make_envs("async", n, bank, budgets=budgets)
        try:
            envs.reset(seed=0)
            envs.step((bash("true"),) * n)
            start = time.perf_counter()
            envs.step((bash("sleep 1"),) + (bash("true"),) * (n - 1))
            took = time.perf_counter() - start
        finally:
            envs.close()
        lines.append(
            f"AsyncVectorEnv.step, env 0 sleeping 1 s: the batch returned after {took:.2f} s; "
            f"envs 1-{n - 1} made 1 step each in that time (they wait for env 0)"
        )
    if "ray" in modes:
        progress("head of line: RayVectorEnv.step_some")
        envs = make_envs("ray", n, bank, budgets=budgets)
        try:
            envs.reset(seed=0)
            envs.step((bash("true"),) * n)
            others = list(range(1, n))
            start = time.perf_counter()
            envs.step_some([0], [bash("sleep 1")])
            fast_steps, slow_done = 0, None
            while slow_done is None:
                for _ in envs.step_some(others, [bash("true")] * len(others)):
                    fast_steps += 1
                if envs.pool.wait([0], timeout=0):  # collected: env 0's call returned
                    slow_done = time.perf_counter() - start
        finally:
            envs.close()
        lines.append(
            f"RayVectorEnv.step_some, env 0 sleeping 1 s: its result came after "
            f"{slow_done:.2f} s; meanwhile envs 1-{n - 1} made {fast_steps} steps "
            f"({fast_steps / slow_done:,.0f} steps/s)"
        )
    return lines


def print_tables(rates: dict, modes: list[str], sizes: list[int]) -> None:
    cpus = os.cpu_count() or 1
    notes = {
        "sleep": f"`{CALLS['sleep']}`: env steps/s (% of ideal = 1-env rate x n)",
        "true": (
            f"`{CALLS['true']}`: env steps/s (% of the CPU bound = 1-env rate x min(n, "
            f"{cpus} CPUs))"
        ),
    }
    for call in CALLS:
        print(f"\n{notes[call]}")
        header = ["envs", *modes, *(f"ideal {m}" for m in modes if call == "sleep")]
        rows = [header]
        for n in sizes:
            row = [str(n)]
            for mode in modes:
                r, one = rates[call][mode].get(n), rates[call][mode].get(sizes[0])
                if r is None or one is None:
                    row.append("-")
                    continue
                bound = one / sizes[0] * (n if call == "sleep" else min(n, cpus))
                row.append(f"{r:,.1f} ({100 * r / bound:.0f}%)")
            if call == "sleep":
                for mode in modes:
                    one = rates[call][mode].get(sizes[0])
                    row.append("-" if one is None else f"{one / sizes[0] * n:,.1f}")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for i, row in enumerate(rows):
            print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
            if i == 0:
                print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8,32", help="numbers of envs, first is the base")
    parser.add_argument("--modes", default=",".join(MODES), help="sync, async and/or ray")
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="timed stepping per cell (at least 3 steps)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    print(
        f"bat_gym vector scaling: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{ENV_ID} on {BENCHMARK}, load average {os.getloadavg()[0]:.1f} at start"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bat_gym_vec_") as tmp:
        from bat_gym.bank import build_bank
        from bat_gym.catalog import get_benchmark

        progress("building a toy bank")
        bank = build_bank(get_benchmark(BENCHMARK), Path(tmp) / "bank", tasks_per_track=1).root
        if "ray" in modes:
            import ray

            # Token auth would write a token under the home folder; a short temp dir
            # keeps Ray's socket paths under the kernel's limit.
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
            progress("starting a local Ray")
            ray.init(include_dashboard=False, log_to_driver=False, _temp_dir=ray_tmp)
        try:
            rates = measure(modes, sizes, bank, args.seconds)
            lines = head_of_line(modes, bank)
        finally:
            if "ray" in modes:
                ray.shutdown()
                shutil.rmtree(ray_tmp, ignore_errors=True)
    print_tables(rates, modes, sizes)
    print()
    for line in lines:
        print(line)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    sys.exit(main())
