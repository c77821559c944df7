"""``bat-gym demo``: one end-to-end episode of the default benchmark, solved by its teacher."""

from __future__ import annotations

import time
from typing import Annotated

import typer


def demo(
    env_id: Annotated[str, typer.Option("--env", help="Env id to run.")] = "bat/E2E-v0",
    backend: Annotated[
        str, typer.Option("--backend", help="Sandbox backend: local or docker.")
    ] = "local",
    seed: Annotated[int, typer.Option("--seed", help="Seed for picking the start state.")] = 0,
) -> None:
    """Make an env, let the scripted teacher play one episode through reset/step, print it."""
    import gymnasium as gym

    from bat_gym.errors import BankError
    from bat_gym.protocol import get_protocol

    start = time.perf_counter()
    env = gym.make(env_id, backend=backend)
    try:
        obs, info = env.reset(seed=seed)
        base = env.unwrapped
        typer.echo(
            f"{env_id}: state {info['state_id']} (track {info['track']}, focus {info['stage']}), "
            f"sandbox isolation: {info['isolation']}, ready in {time.perf_counter() - start:.2f} s"
        )
        state = base.state
        bench = base.benchmark
        task = bench.task_of_state(state)
        if task is None:
            raise BankError(
                state.state_id,
                "the teacher needs the row's task, and its provenance cannot regenerate it",
            )
        proto = get_protocol("hermes")
        turns = [
            t
            for t in bench.teacher_turns(task)
            if info["stage"] == "E2E" or t.stage >= info["stage"]
        ]
        terminated = truncated = False
        for turn in turns:
            if terminated or truncated:
                break
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(
                proto.render(turn.content, list(turn.calls))
            )
            first = obs.splitlines()[0] if obs else ""
            typer.echo(
                f"  [{turn.stage}] {turn.content}\n      -> {first}  ({(time.perf_counter() - t0) * 1e3:.0f} ms)"
            )
        record = info["record"]
        typer.echo(
            f"episode over: terminated={terminated} truncated={truncated} reward={reward} "
            f"tool calls={len(record.calls)} ok={sum(c.succeeded for c in record.calls)} "
            f"workspace changed={record.any_change} in {time.perf_counter() - start:.2f} s"
        )
        verdict = info.get("verdict")
        if verdict is not None:
            stages = " ".join(f"{s.stage}={s.score}" for s in verdict.stages)
            typer.echo(
                f"verdict ({verdict.contract.id} {verdict.contract.version}, sha256 {verdict.contract.sha256[:12]}): "
                f"stages {stages}; task {verdict.task_score}; evidence completeness {verdict.eta:.2f}"
            )
    finally:
        env.close()
