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
crashed, a policy backend that raised :class:`~bat_gym.policies.PolicyError`, a lost
env) is played again by the :class:`~bat_gym.rollout.Runner`'s retry rule, up to
``max_attempts`` times, and, if it persists (or an env error that playing again cannot
fix ends it), recorded as an *invalid* cell: never scored as a model failure, and it
keeps the run from the gate.
"""

from __future__ import annotations

import functools
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bat_gym.benchmark import Benchmark
from bat_gym.core import progress
from bat_gym.core.errors import ConfigError
from bat_gym.core.files import write_atomic
from bat_gym.core.spec import Budgets, StageState
from bat_gym.evaluation.cells import Cell, CellResult, FailureCategory
from bat_gym.evaluation.episodes import write_episode
from bat_gym.policies.base import Policy, PolicyError, SeedKey
from bat_gym.rollout import Runner, SandboxRestarted, policy_actor, run_episode

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
            current progress reporter (:mod:`bat_gym.core.progress`: logged by default, a
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
        PolicyError: the policy backend failed.
        SandboxRestarted: the sandbox crashed mid-episode.
    """
    act = policy_actor(policy, bench, state, seed_key=seed_key)
    info = None
    try:
        end = run_episode(env, act, state_id=state.state_id)
        info = end.info
    finally:
        policy.end_episode(seed_key, info)
    return end.info, end.finished


def infrastructure_error(exc: Exception) -> str:
    """How an episode that could not be played is described in its invalid record."""
    if isinstance(exc, PolicyError):  # the backend's failure, not the model's answer
        return f"policy failed: {exc}"
    if isinstance(exc, SandboxRestarted):
        return "the sandbox crashed during a tool call and was restarted"
    trace = "".join(traceback.format_exception(exc, limit=3))
    return f"{type(exc).__name__}: {exc}\n{trace}"


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


def _score(info: dict[str, Any], finished: bool, bench: Benchmark) -> dict[str, Any]:
    from bat_gym.rubrics.verifier.scoring import overall_score

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
    from bat_gym.core.sandbox.snapshot import BlobStore

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
        # Ray actors build their envs from this factory (pickled), states and all.
        build = (
            functools.partial(_rubric_env, bench, cfg, budgets) if make_env is None else make_env
        )
        runner = Runner(
            functools.partial(build, source),
            workers=cfg.workers,
            max_attempts=cfg.max_attempts,
            ray=cfg.ray if make_env is None else None,
            name="bat-eval",
        )
        shown = progress.task(
            "evaluating: held-out cells", len(cells), done=len(done), shown=cfg.progress
        )
        if done:
            shown.note(f"[{len(done)}/{len(cells)}] already finished, resuming")
        play = _CellPlay(bench, policy, out, runner, states, shown)
        try:
            done.update((r.cell.key, r) for r in runner.map(play, todo))
        finally:
            shown.close()
            runner.close()
    return [done[c.key] for c in cells if c.key in done]


def _rubric_env(bench: Benchmark, cfg: EvalConfig, budgets: Budgets, states: Any) -> Any:
    """The default evaluation env: a rubric-wrapped E2E StageEnv over the state source."""
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.verifier.reward import RubricReward

    return RubricReward(
        StageEnv(
            "E2E",
            benchmark=bench,
            states=states,
            backend=cfg.backend,
            protocol=cfg.protocol,
            budgets=budgets,
            sandbox_options=cfg.sandbox_options,
        )
    )


@dataclass
class _CellPlay:
    """Plays one cell on the runner and keeps its result (``cells/<key>.json``, its episode)."""

    bench: Benchmark
    policy: Policy
    out: Path
    runner: Runner
    states: dict[tuple[str, Any], StageState]
    shown: progress.ProgressTask

    def __call__(self, cell: Cell) -> CellResult:
        """The cell's result: scored, or invalid when no attempt could play it."""
        state = self.states[(cell.track, cell.seed)]
        tier = _tier_of(self.bench, state)
        play = functools.partial(self._score, cell, state, tier)
        played = self.runner.attempt(play, what=f"cell {cell.key}")
        if played.error is None:
            result = played.value.model_copy(update={"attempts": played.attempts})
            write_atomic(
                self.out / CELLS_DIR / f"{cell.key}.json", result.model_dump_json(indent=1)
            )
        else:
            result = CellResult(
                cell=cell,
                task_id=state.task_id,
                tier=tier,
                valid=False,
                error=infrastructure_error(played.error),
                attempts=played.attempts,
                failures=("infrastructure",),
            )
        self.shown.count(_cell_line(result))
        return result

    def _score(self, cell: Cell, state: StageState, tier: str | None, env: Any) -> CellResult:
        """One attempt: play the cell's episode on ``env`` and score it."""
        start = time.perf_counter()
        info, finished = play_episode(env, self.policy, state, self.bench, seed_key=cell.seed_key)
        scored = _score(info, finished, self.bench)
        wall_s = time.perf_counter() - start
        # After wall_s: keeping the trace is not the episode's time.
        write_episode(self.out, cell.key, info, env)
        return CellResult(
            cell=cell, task_id=state.task_id, tier=tier, valid=True, wall_s=wall_s, **scored
        )


def _cell_line(result: CellResult) -> str:
    """One finished cell, as the progress display lists it."""
    score = (
        "INVALID"
        if not result.valid
        else ("overall -" if result.overall is None else f"overall {result.overall:.3f}")
    )
    return f"{result.cell.key:32s} {score:14s} {result.wall_s:5.1f} s"
