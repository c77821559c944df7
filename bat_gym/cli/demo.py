"""``bat-gym demo``: one episode of the default benchmark, played by its teacher.

The teacher is the benchmark's scripted careful engineer. In the E2E env it works
through every stage; in a stage env (``--env bat/Plan-v0``) it plays only that stage's
turns and then calls ``finish``, as a policy trained on the stage would.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from bat_gym.cli.options import Backend, Quiet
from bat_gym.core import progress
from bat_gym.core.protocol import ToolCall
from bat_gym.rollout import Step, run_episode

__all__ = ["demo"]


def demo(
    env_id: Annotated[
        str, typer.Option("--env", help="Env id to run (bat-gym envs lists them).")
    ] = "bat/E2E-v0",
    backend: Backend = "local",
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            min=0,
            help=(
                "Which start state: the N-th of the env's success states, track by track "
                "in id order (wrapping), so each seed up to their count plays a different one."
            ),
        ),
    ] = 0,
    quiet: Quiet = False,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain", help="Print the verdict item by item (Verdict.explain()), not one line."
        ),
    ] = False,
) -> None:
    """Make an env, let the scripted teacher play one episode through reset/step, print it.

    On first use the default states are built: only the teacher trajectory holding the
    state the reset picks (a few seconds), then cached.
    """
    import gymnasium as gym

    from bat_gym.core.errors import EnvNotFound

    if env_id not in gym.registry:
        raise EnvNotFound(env_id, [k for k in gym.registry if k.startswith("bat/")])
    with progress.use(progress.for_cli(quiet)):
        _demo(gym, env_id, backend, seed, explain)


def _start_state(base: Any, seed: int) -> str:
    """The ``seed``-th state the teacher can finish well, track by track, in id order.

    A seeded Gymnasium draw over a few states gives the same first pick for many
    seeds, and may land on a failure-outcome state, whose history holds a mistake the
    teacher's success turns do not undo. So the demo walks the env's states whose
    outcome is ``success`` (all its states if none is), one per seed. It asks one
    track at a time, and only as far as the seed needs: listing a track's default
    states builds its teacher trajectories.
    """
    tracks = [base.track] if base.track else [t.name for t in base.benchmark.spec.tracks]
    ids: list[str] = []
    for track in tracks:
        ids += base.states.select(focus=base.focus, track=track, outcome="success")
        if len(ids) > seed:
            break
    ids = ids or base.states.select(focus=base.focus, track=base.track)
    if not ids:
        from bat_gym.core.errors import ConfigError

        raise ConfigError(f"{base.spec.id if base.spec else 'the env'} has no states to start from")
    return ids[seed % len(ids)]


def _demo(gym: Any, env_id: str, backend: str, seed: int, explain: bool) -> None:
    from bat_gym.core.errors import BankError
    from bat_gym.core.protocol import get_protocol

    start = time.perf_counter()
    env = gym.make(env_id, backend=backend)
    try:
        base = env.unwrapped
        with progress.task(f"{env_id}: reset"):
            obs, info = env.reset(seed=seed, options={"state_id": _start_state(base, seed)})
        typer.echo(
            f"{env_id}: state {info['state_id']} (track {info['track']}, focus {info['stage']}) "
            f"from the states at {getattr(base.states, 'root', '(in memory)')}\n"
            f"sandbox isolation: {info['isolation']}; ready in {time.perf_counter() - start:.2f} s"
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
        focus = info["stage"]
        turns = [
            (t.content, list(t.calls))
            for t in bench.teacher_turns(task)
            if focus == "E2E" or t.stage == focus
        ]
        if focus != "E2E":  # the stage's own work, then done: later stages are not asked for
            turns = [(c, [k for k in calls if k.name != "finish"]) for c, calls in turns]
            turns.append(
                (
                    f"Stage {focus} is done.",
                    [ToolCall(name="finish", arguments={"summary": f"{focus} done"})],
                )
            )
        pending = iter(enumerate(turns, 1))
        with progress.task("the teacher's turns", len(turns)) as shown:
            t0 = time.perf_counter()

            def act(_: dict) -> str | None:
                nonlocal t0
                nxt = next(pending, None)
                if nxt is None:
                    return None
                n, (content, calls) = nxt
                last = n == len(turns) or any(c.name == "finish" for c in calls)
                # The last step also scores the episode (the verifier runs out of band).
                shown.describe(f"turn {n}" + (": scoring the episode" if last else ""))
                t0 = time.perf_counter()
                return proto.render(content, calls)

            def echo(step: Step) -> None:
                first = step.observation.splitlines()[0] if step.observation else ""
                shown.advance()
                typer.echo(
                    f"  {turns[step.turn - 1][0]}\n      -> {first}  "
                    f"({(time.perf_counter() - t0) * 1e3:.0f} ms)"
                )

            end = run_episode(env, act, info=info, on_step=echo, on_restart="ignore")
        terminated, truncated, info = end.terminated, end.truncated, end.info
        reward = 0.0 if end.reward is None else end.reward
        record = info["record"]
        typer.echo(
            f"episode over: {'finished' if terminated else 'budget spent' if truncated else 'stopped'}"
            f" after {len(record.calls)} tool calls ({sum(c.succeeded for c in record.calls)} exited 0)"
            f" in {time.perf_counter() - start:.1f} s"
        )
        verdict = info.get("verdict")
        if verdict is None:
            return
        typer.echo(f"verdict: {verdict.explain() if explain else verdict.summary()}")
        if verdict.task_score is not None:
            tw = bench.spec.task_weight
            typer.echo(
                f"reward {reward:.3f} = {tw:g} x task score {verdict.task_score:.3f} "
                f"+ {1 - tw:g} x weighted stage credit {verdict.stage_score or 0.0:.3f}"
            )
        else:
            typer.echo(f"reward {reward:.3f} (the stage's credit; stage rows have no task score)")
    finally:
        env.close()
