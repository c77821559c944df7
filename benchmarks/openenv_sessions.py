"""Step latency of ``bat-gym serve openenv`` under concurrent sessions, against the env in process.

Starts the server command on a free port of 127.0.0.1 over a toy_pipeline bank, opens
``--sessions`` WebSocket sessions at once with OpenEnv's typed client (one sandbox
each), resets each to a state (the bank's states in turn) and steps each ``--steps``
times with a small ``execute_code`` call that writes the session's own token into
/workspace and lists every token file it can see; then ``finish``. A session that sees
another's token fails the run. The same calls are timed on one in-process env
(RubricReward around StageEnv), one step after another, as the baseline.

Each step's latency is the client's round trip (send, env step in the sandbox, reply),
given apart for the ``execute_code`` steps and the ``finish`` step (which runs the
rubric verifier).
With more sessions than cores the sandboxes queue for the CPUs, so the server's p50
grows with the sessions; compare the one-session row with the in-process one for
the server's own overhead.

Usage: python benchmarks/openenv_sessions.py [--sessions 64] [--steps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bat_gym.bank import build_bank
from bat_gym.catalog import get_benchmark
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.env import StageEnv
from bat_gym.integrations.openenv import BatAction
from bat_gym.integrations.openenv_client import BatEnvClient
from bat_gym.rubrics.verifier.reward import RubricReward

BAT_GYM = str(Path(sys.executable).parent / "bat-gym")


def token_call(token: str) -> BatAction:
    """Write this session's token and list every token file the sandbox can see."""
    code = f"echo {token} > /workspace/token_{token}.txt && ls /workspace | grep '^token_' || true"
    return BatAction(tool="execute_code", arguments={"language": "bash", "code": code})


FINISH = BatAction(tool="finish", arguments={"summary": "latency run"})


def quantiles(seconds: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return statistics.median(ms), p99


def in_process(bench, bank, state_ids: list[str], steps: int) -> list[tuple[str, float]]:
    protocol = get_protocol("hermes")
    env = RubricReward(StageEnv(benchmark=bench, states=bank))
    latencies = []
    try:
        for i, state_id in enumerate(state_ids):
            env.reset(options={"state_id": state_id})
            for action in [token_call(f"s{i}")] * steps + [FINISH]:
                turn = protocol.render("", [ToolCall(name=action.tool, arguments=action.arguments)])
                t0 = time.perf_counter()
                env.step(turn)
                latencies.append((action.tool, time.perf_counter() - t0))
    finally:
        env.close()
    return latencies


async def session(url: str, state_id: str, token: str, steps: int) -> list[tuple[str, float]]:
    latencies = []
    async with BatEnvClient(base_url=url, message_timeout_s=600) as env:
        await env.reset(state_id=state_id)
        for action in [token_call(token)] * steps + [FINISH]:
            t0 = time.perf_counter()
            result = await env.step(action)
            latencies.append((action.tool, time.perf_counter() - t0))
            seen = {w for w in result.observation.text.split() if w.startswith("token_")}
            if seen - {f"token_{token}.txt"}:
                raise RuntimeError(f"session {token} saw another session's files: {sorted(seen)}")
    return latencies


async def sessions(url: str, state_ids: list[str], steps: int) -> list[tuple[str, float]]:
    played = await asyncio.gather(
        *(session(url, s, f"s{i}", steps) for i, s in enumerate(state_ids))
    )
    return [t for latencies in played for t in latencies]


def start_server(bank_root: Path, max_sessions: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [BAT_GYM, "serve", "openenv", "--benchmark", "toy_pipeline", "--states"]
    args += [str(bank_root), "--port", str(port), "--max-sessions", str(max_sessions)]
    proc = subprocess.Popen(args)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("bat-gym serve openenv did not start") from None
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions")
    parser.add_argument("--steps", type=int, default=5, help="execute_code steps per session")
    args = parser.parse_args()

    bench = get_benchmark("toy_pipeline")
    with tempfile.TemporaryDirectory() as tmp:
        bank = build_bank(bench, Path(tmp) / "bank", tasks_per_track=2)
        pool = sorted(bank.select())
        state_ids = [pool[i % len(pool)] for i in range(args.sessions)]
        baseline = in_process(bench, bank, state_ids[:8], args.steps)
        proc, url = start_server(Path(bank.root), args.sessions)
        try:
            one = asyncio.run(sessions(url, state_ids[:1], args.steps))
            t0 = time.perf_counter()
            many = asyncio.run(sessions(url, state_ids, args.steps))
            wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    print(f"{'path':<34}{'step':<14}{'steps':>7}{'p50 ms':>10}{'p99 ms':>10}")
    rows = [
        ("in-process env, one at a time", baseline),
        ("server, 1 session", one),
        (f"server, {args.sessions} concurrent sessions", many),
    ]
    # execute_code steps run a program; the finish step runs the rubric verifier.
    for name, latencies in rows:
        for tool in ("execute_code", "finish"):
            seconds = [t for kind, t in latencies if kind == tool]
            p50, p99 = quantiles(seconds)
            print(f"{name:<34}{tool:<14}{len(seconds):>7}{p50:>10.1f}{p99:>10.1f}")
    print(
        f"{args.sessions} sessions x {args.steps + 1} steps in {wall:.1f} s "
        f"({len(many) / wall:.1f} steps/s); no session saw another's files"
    )


if __name__ == "__main__":
    main()
