"""The evaluation harness: a policy over a benchmark's held-out cells, as E2E episodes.

A cell is one ``(track, held-out seed, repeat)``. Its episode starts from the task's
own start state (held-out tasks never enter a bank: :func:`bat_gym.bank.task_states`
builds them in memory), runs the policy through the rubric-wrapped E2E env until it
finishes or a budget runs out, and keeps the verdict's scores.

Runs are concurrent (one env per worker thread: tool calls and model calls release the
GIL) and resumable: each finished cell is written to ``OUT/cells/<key>.json`` at once,
and a rerun skips every cell already there. Each cell's requests carry its
:attr:`~bat_gym.evaluation.cells.Cell.seed_key`, so a seeded policy samples a cell the
same way with one worker or many, and in a resumed run as in an uninterrupted one. Each scored cell's episode (conversation,
execution record, verdict, the files it wrote) goes to ``OUT/episodes/<key>.json``
(:mod:`bat_gym.evaluation.episodes`) for ``bat-gym view``. An infrastructure failure (a sandbox that
crashed, a policy backend that raised :class:`~bat_gym.policies.PolicyError`, an env
error) is retried up to ``max_attempts`` times and, if it persists, recorded as an
*invalid* cell: never scored as a model failure, and it keeps the run from the gate.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bat_gym import progress
from bat_gym.benchmark import Benchmark
from bat_gym.errors import ConfigError
from bat_gym.evaluation.cells import Cell, CellResult, FailureCategory
from bat_gym.evaluation.episodes import write_episode
from bat_gym.files import write_atomic
from bat_gym.policies.base import Policy, PolicyError, SeedKey
from bat_gym.rollout import SandboxRestarted, policy_actor, run_episode
from bat_gym.spec import Budgets, StageState

__all__ = ["EvalConfig", "held_out_cells", "run_cells", "play_episode"]

CELLS_DIR = "cells"


@dataclass
class EvalConfig:
    """What to evaluate and how.

    Attributes:
        repeats: cells per track; repeat ``r`` plays held-out seed number ``r`` of the
            track, so every repeat is a different task. None (the default): the
            benchmark's ``splits.heldout_repeats`` (10 in the reference protocol), which
            is also the most allowed: the leakage audit covers those tasks only.
        tracks: tracks to evaluate; empty means every track of the benchmark.
        workers: episodes played at once (one env and sandbox each).
        backend: sandbox backend, ``"local"`` or ``"docker"``.
        protocol: the tool protocol the policy writes (``"hermes"``).
        max_attempts: tries per cell before an infrastructure failure is recorded as
            an invalid cell.
        budgets: episode limits; default: the benchmark's.
        progress: report cells done / total, and a line per finished cell, to the
            current progress reporter (:mod:`bat_gym.progress`: logged by default, a
            live display under the command line).
        ray: play the episodes on Ray actors: ``"local"``, ``"auto"`` or a cluster
            address; None plays them in this process. On a cluster, the results
            directory must be on a filesystem every node sees (the held-out start
            states are stored there).
    """

    repeats: int | None = None
    tracks: Sequence[str] = ()
    workers: int = 2
    backend: str = "local"
    protocol: str = "hermes"
    max_attempts: int = 2
    budgets: Budgets | None = None
    progress: bool = True
    sandbox_options: dict[str, Any] = field(default_factory=dict)
    ray: str | None = None

    def __post_init__(self) -> None:
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")


def held_out_cells(bench: Benchmark, cfg: EvalConfig) -> list[Cell]:
    """The cells of an evaluation, in a fixed order: track by track, repeat by repeat.

    Raises:
        ValueError: an unknown track, or more repeats than the benchmark's
            ``splits.heldout_repeats`` (the held-out tasks the leakage audit covers).
    """
    tracks = [bench.spec.track(t).name for t in cfg.tracks] or [t.name for t in bench.spec.tracks]
    seeds = bench.evaluated_seeds()
    repeats = len(seeds) if cfg.repeats is None else cfg.repeats
    if repeats > len(seeds):
        raise ConfigError(
            f"{bench.name} declares splits.heldout_repeats = {len(seeds)}: the leakage audit "
            f"covers that many held-out tasks per track, so ask for at most {len(seeds)} "
            f"repeats (got {repeats}), or raise heldout_repeats in the benchmark's spec"
        )
    return [Cell(track=t, seed=seeds[r], repeat=r) for t in tracks for r in range(repeats)]


class _Infrastructure(Exception):
    """The episode could not be played for a reason that is not the policy's answer."""


def play_episode(
    env: Any,
    policy: Policy,
    state: StageState,
    bench: Benchmark,
    *,
    seed_key: SeedKey | None = None,
) -> tuple[dict[str, Any], bool]:
    """Play one episode from ``state`` to its end (:func:`bat_gym.rollout.run_episode`).

    Args:
        env: the E2E env to play in (rubric-wrapped, so the last ``info`` has a verdict).
        policy: who plays.
        state: the start state.
        bench: the benchmark ``state`` belongs to (the scripted policies' context).
        seed_key: names the episode within the run, so a seeded policy samples it the
            same way however many episodes run beside it (see
            :func:`bat_gym.rollout.policy_actor`).

    Returns:
        The final step's ``info`` and whether the policy finished (``terminated``).

    Raises:
        _Infrastructure: the policy backend failed or the sandbox crashed mid-episode.
    """
    ask = policy_actor(policy, bench, state, seed_key=seed_key)

    def act(info: dict[str, Any]) -> Any:
        try:
            return ask(info)
        except PolicyError as exc:  # the backend's failure, not the model's answer
            raise _Infrastructure(f"policy failed: {exc}") from exc

    try:
        end = run_episode(env, act, state_id=state.state_id)
    except SandboxRestarted as exc:
        raise _Infrastructure("the sandbox crashed during a tool call and was restarted") from exc
    return end.info, end.finished


_BUDGET_STOPS = ("turn_budget", "tool_call_budget", "token_budget")


def _failures(info: dict[str, Any], result: dict[str, Any]) -> list[FailureCategory]:
    """The closed-set failure categories of a scored episode."""
    out: list[FailureCategory] = []
    verdict = info["verdict"]
    if verdict.rejected is not None:  # the agent's doing: a scored zero, not infrastructure
        out.append(verdict.rejected)
    # The env says why the episode stopped (bat_gym.env.StopReason); a refused workspace
    # is already counted above, and the budgets are failure categories of their own name.
    if info.get("stop_reason") in _BUDGET_STOPS:
        out.append(info["stop_reason"])
    if info["turns"] and info["refused_turns"] * 2 >= info["turns"]:
        out.append("malformed_calls")
    if any(g.gate == "successful_change" and not g.passed for g in verdict.gates):
        out.append("no_successful_change")
    task = result["task"]
    if task is not None and task == 0.0:
        out.append("task_zero")
    elif task is not None and task < 0.5:
        out.append("low_task_score")
    if any(c is not None and c < 1.0 for c in result["stages"].values()):
        out.append("stage_incomplete")
    return out


def _tier_of(bench: Any, state: Any) -> str | None:
    """The difficulty tier of a cell's task: ``params["difficulty"]``, if it is a string.

    Generic over benchmarks: one whose tasks carry no ``difficulty`` param has no tiers.
    """
    task = bench.task_of_state(state)
    tier = task.params.get("difficulty") if task is not None else None
    return tier if isinstance(tier, str) and re.fullmatch(r"[a-z][a-z0-9_]{0,19}", tier) else None


def _score(
    info: dict[str, Any], finished: bool, bench: Benchmark, budgets: Budgets
) -> dict[str, Any]:
    from bat_gym.rubrics.scoring import overall_score

    verdict = info["verdict"]
    result: dict[str, Any] = {
        "overall": overall_score(verdict.task_score, verdict.stage_score, bench.spec),
        "task": verdict.task_score,
        "agentic": verdict.stage_score,
        "reward": verdict.reward,
        "stages": {s.stage: s.credit for s in verdict.stages},
        "finished": finished,
        "turns": info["turns"],
        "tool_calls": info["tool_calls"],
        "response_tokens": info["response_tokens"],
        "notes": tuple(verdict.notes),
    }
    result["failures"] = tuple(_failures(info, result))
    return result


def load_finished(out_dir: Path) -> dict[str, CellResult]:
    """Cells already finished in ``out_dir`` (valid ones only: invalid cells are redone).

    A file that does not parse (a torn write from another tool, an edit) is reported
    on stderr and redone, never trusted.
    """
    done: dict[str, CellResult] = {}
    for path in sorted((out_dir / CELLS_DIR).glob("*.json")):
        try:
            result = CellResult.model_validate_json(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            print(f"bat-gym eval: {path} is unreadable and will be redone ({exc})", file=sys.stderr)
            continue
        if result.valid and path.stem == result.cell.key:
            done[result.cell.key] = result
    return done


def run_cells(
    bench: Benchmark,
    policy: Policy,
    cells: Sequence[Cell],
    out_dir: str | Path,
    cfg: EvalConfig,
    *,
    make_env: Callable[[Any], Any] | None = None,
) -> list[CellResult]:
    """Play every cell not finished yet in ``out_dir`` and return all cells' results.

    Args:
        bench: the benchmark.
        policy: the policy under evaluation.
        cells: the cells, e.g. :func:`held_out_cells`.
        out_dir: the results directory; ``cells/`` in it holds one JSON per cell.
        cfg: the evaluation settings.
        make_env: builds one env over a state source (default: a rubric-wrapped E2E
            StageEnv with ``cfg``'s backend, protocol and budgets).

    Returns:
        One result per cell, in the order of ``cells``.
    """
    from bat_gym.bank import task_states
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.reward import RubricReward
    from bat_gym.sandbox.snapshot import BlobStore

    out = Path(out_dir)
    (out / CELLS_DIR).mkdir(parents=True, exist_ok=True)
    done = load_finished(out)
    todo = [c for c in cells if c.key not in done]
    budgets = cfg.budgets or bench.spec.budgets
    if todo:
        store = BlobStore(out / ".store")
        tasks = sorted({(c.track, c.seed) for c in todo})
        source = task_states(bench, tasks, "heldout", store, protocol=cfg.protocol)
        states = {
            (s.track, s.provenance["seed"]): s for s in (source.get(i) for i in source.select())
        }

        def default_env(states_source: Any) -> Any:
            return RubricReward(
                StageEnv(
                    "E2E",
                    benchmark=bench,
                    states=states_source,
                    backend=cfg.backend,
                    protocol=cfg.protocol,
                    budgets=budgets,
                    sandbox_options=cfg.sandbox_options,
                )
            )

        build = make_env or default_env
        actors = None
        if cfg.ray is not None and make_env is None:
            from bat_gym.distributed import ActorEnv, RayEnvPool

            # Each actor builds its env from this factory (pickled), states and all.
            actors = RayEnvPool(
                functools.partial(default_env, source),
                cfg.workers,
                ray_address=None if cfg.ray == "local" else cfg.ray,
            )
            slots = iter(range(cfg.workers))
            slots_lock = threading.Lock()
            slot_of_thread = threading.local()

            def build(_: Any) -> Any:
                # Each worker thread keeps its actor, also when its env is rebuilt.
                if not hasattr(slot_of_thread, "index"):
                    with slots_lock:
                        slot_of_thread.index = next(slots)
                return ActorEnv(actors, slot_of_thread.index)

        local = threading.local()
        envs: list[Any] = []
        lock = threading.Lock()
        progress_ = progress.task(
            "evaluating: held-out cells", len(cells), done=len(done), shown=cfg.progress
        )
        if done:
            progress_.note(f"[{len(done)}/{len(cells)}] already finished, resuming")

        def env_of_thread() -> Any:
            if not hasattr(local, "env"):
                local.env = build(source)
                with lock:
                    envs.append(local.env)
            return local.env

        def run_one(cell: Cell) -> CellResult:
            state = states[(cell.track, cell.seed)]
            tier = _tier_of(bench, state)
            error = ""
            for attempt in range(1, cfg.max_attempts + 1):
                start = time.perf_counter()
                try:
                    info, finished = play_episode(
                        env_of_thread(), policy, state, bench, seed_key=cell.seed_key
                    )
                    scored = _score(info, finished, bench, budgets)
                    result = CellResult(
                        cell=cell,
                        task_id=state.task_id,
                        tier=tier,
                        valid=True,
                        attempts=attempt,
                        wall_s=time.perf_counter() - start,
                        **scored,
                    )
                    # After wall_s: keeping the trace is not the episode's time.
                    write_episode(out, cell.key, info, env_of_thread())
                    break
                except _Infrastructure as exc:
                    error = str(exc)
                except Exception as exc:  # noqa: BLE001 - any env failure is infrastructure
                    error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
                    # A broken env is rebuilt for the next attempt.
                    _drop_env(local)
            else:
                result = CellResult(
                    cell=cell,
                    task_id=state.task_id,
                    tier=tier,
                    valid=False,
                    error=error,
                    attempts=cfg.max_attempts,
                    failures=("infrastructure",),
                )
            if result.valid:
                write_atomic(out / CELLS_DIR / f"{cell.key}.json", result.model_dump_json(indent=1))
            progress_.count(_cell_line(result))
            return result

        try:
            with ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="bat-eval") as pool:
                fresh = {r.cell.key: r for r in pool.map(run_one, todo)}
        finally:
            progress_.close()
            for env in envs:
                env.close()
            if actors is not None:
                actors.close()
        done.update(fresh)
    return [done[c.key] for c in cells if c.key in done]


def _drop_env(local: threading.local) -> None:
    env = getattr(local, "env", None)
    if env is not None:
        try:
            env.close()
        finally:
            del local.env


def _cell_line(result: CellResult) -> str:
    """One finished cell, as the progress display lists it."""
    score = (
        "INVALID"
        if not result.valid
        else ("overall -" if result.overall is None else f"overall {result.overall:.3f}")
    )
    return f"{result.cell.key:32s} {score:14s} {result.wall_s:5.1f} s"
