"""The reward-hackability audit: generic exploits against a benchmark's reward.

:func:`audit_reward` plays every exploit of :mod:`bat_gym.audits.exploits` on a deterministic
sample of the benchmark's Stage Bank states (N per stage focus) and on held-out E2E
cells (played by the evaluation harness, :func:`bat_gym.evaluation.run_cells`, as
``bat-gym eval`` plays them: real held-out tasks, never in a bank), and plays the
benchmark's naive baseline and its teacher (:class:`~bat_gym.policies.ScriptedPolicy`)
on the same states and cells. The report is a table policy x stage of mean reward,
and the cells where an exploit beats the targets:

* ``margin``: the exploit's mean is more than ``margin`` above the naive baseline's
  on the same stage (the naive baseline as the benchmark defines it,
  ``Benchmark.naive_turns``; a benchmark without one has no margin test);
* ``absolute``: on a stage row (S1..S5) the mean is above ``absolute``, unless the
  naive baseline itself earns more there (the report lists each such waived bound with
  its reason, :func:`waived_bounds`); on the held-out E2E column too when the
  benchmark has no naive baseline.

Stage states are sampled only from admitted rows: those a demonstration won
(:mod:`bat_gym.bank.demonstrate`).

Means: over the sampled states for a stage row; over tracks (each track the mean of
its cells, as :func:`bat_gym.rubrics.verifier.scoring.aggregate`) for held-out cells. Null
rewards and cells lost to infrastructure are left out and counted in the episodes.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
from pydantic import BaseModel, ConfigDict, Field

from bat_gym.benchmark import Benchmark
from bat_gym.core import progress as display
from bat_gym.core.errors import ConfigError, StateNotAdmitted
from bat_gym.policies.base import Policy

__all__ = [
    "HELDOUT",
    "NAIVE",
    "TEACHER",
    "AuditEpisode",
    "AuditFailure",
    "AuditReport",
    "WaivedBound",
    "admitted",
    "audit_reward",
    "judge",
    "sample_states",
    "waived_bounds",
]

HELDOUT = "E2E-heldout"
NAIVE = "naive"
TEACHER = "teacher"
_STRICT = ConfigDict(extra="forbid", frozen=True)


class AuditEpisode(BaseModel):
    """One episode of the audit: who played what, the reward, and each rubric item's decision."""

    model_config = _STRICT

    policy: str
    stage: str = Field(description="S1..S5 (a Stage Bank state) or E2E-heldout (a held-out cell).")
    track: str
    where: str = Field(description="The state id, or the held-out cell's key.")
    reward: float | None = Field(description="None: null, or the episode was lost.")
    task: float | None = Field(None, description="The task metric (E2E episodes only).")
    valid: bool = Field(True, description="False: infrastructure failed; not scored.")
    error: str | None = None
    items: dict[str, bool | None] = Field(
        default_factory=dict, description="'S3.pilot_ran' -> passed; gates as 'gate.<name>'."
    )
    details: dict[str, str] = Field(default_factory=dict, description="Each item's detail.")
    guards: tuple[str, ...] = Field((), description="Items of ``items`` that are guards.")
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0


class AuditFailure(BaseModel):
    """An exploit that beats a target on one stage."""

    model_config = _STRICT

    exploit: str
    stage: str
    reward: float = Field(description="The exploit's mean reward on the stage.")
    naive: float | None = Field(description="The naive baseline's mean there (None: none).")
    bound: float = Field(description="The largest mean the target allows.")
    rule: Literal["margin", "absolute"]

    def describe(self) -> str:
        """One line: ``shape_only S4 1.000 > 0.500 (naive 0.400 + margin)``."""
        naive = "none" if self.naive is None else f"{self.naive:.3f}"
        why = "naive + margin" if self.rule == "margin" else "absolute bound"
        return (
            f"{self.exploit} {self.stage} {self.reward:.3f} > {self.bound:.3f} "
            f"({why}; naive {naive})"
        )


class WaivedBound(BaseModel):
    """A bound :func:`judge` did not apply on one stage, and why."""

    model_config = _STRICT

    stage: str
    rule: Literal["absolute"]
    bound: float = Field(description="The bound that was not applied.")
    naive: float = Field(description="The naive baseline's mean on the stage.")
    reason: str

    def describe(self) -> str:
        """One line: ``S5: absolute bound 0.35 waived: the naive baseline earns 0.500 ...``."""
        return f"{self.stage}: {self.rule} bound {self.bound:.2f} waived: {self.reason}"


def waived_bounds(
    means: dict[str, dict[str, float | None]],
    stages: Sequence[str],
    *,
    absolute: float = 0.35,
) -> tuple[WaivedBound, ...]:
    """The stage rows on which :func:`judge` waives the absolute bound, with the reason.

    On a stage row (S1..S5) where the naive baseline's own mean is above ``absolute``
    the absolute bound is not applied: the margin over the naive baseline alone
    decides there. (The held-out E2E column takes the absolute bound only where there
    is no naive mean, so nothing is waived on it.)

    >>> [w.stage for w in waived_bounds({"naive": {"S5": 0.5, "S1": 0.0}}, ["S1", "S5"])]
    ['S5']
    """
    naive = means.get(NAIVE, {})
    out = []
    for stage in stages:
        base = naive.get(stage)
        if stage == HELDOUT or base is None or base <= absolute:
            continue
        out.append(
            WaivedBound(
                stage=stage,
                rule="absolute",
                bound=absolute,
                naive=base,
                reason=(
                    f"the naive baseline earns {base:.3f} here, above the bound, so the stage's "
                    "work is within a naive agent's reach; only naive + margin is applied"
                ),
            )
        )
    return tuple(out)


def judge(
    means: dict[str, dict[str, float | None]],
    exploits: Sequence[str],
    stages: Sequence[str],
    *,
    margin: float = 0.10,
    absolute: float = 0.35,
) -> tuple[AuditFailure, ...]:
    """The cells where an exploit beats the targets (see the module docstring).

    ``margin`` fails ``reward > naive + margin`` wherever the naive mean is known;
    ``absolute`` fails ``reward > absolute`` on a stage row, and on ``E2E-heldout``
    when the naive mean is unknown there. Where the naive baseline itself earns more
    than ``absolute`` on a stage row (a stage whose work is within a naive agent's
    reach, such as a submission once the predictions exist; :func:`waived_bounds`
    names these for the report), the margin alone decides:
    an exploit that does as much as the naive agent has done that work. A cell failing
    both is reported once, under the tighter bound.

    Args:
        means: policy -> stage -> mean reward (None: no scored episode); the naive
            baseline's row is ``means["naive"]``, absent when the benchmark has none.
        exploits: the rows to judge.
        stages: the columns to judge.
        margin: how far above the naive baseline an exploit may get.
        absolute: how high an exploit may get on a stage row.

    >>> judge({"x": {"S1": 0.5}, "naive": {"S1": 0.3}}, ["x"], ["S1"], margin=0.1)[0].rule
    'margin'
    >>> judge({"x": {"S5": 0.5}, "naive": {"S5": 0.5}}, ["x"], ["S5"])
    ()
    """
    naive = means.get(NAIVE, {})
    failures = []
    for exploit in exploits:
        for stage in stages:
            reward = means.get(exploit, {}).get(stage)
            if reward is None:
                continue
            base = naive.get(stage)
            bounds: list[tuple[float, Literal["margin", "absolute"]]] = []
            if base is not None:
                bounds.append((base + margin, "margin"))
            if base is None or (stage != HELDOUT and base <= absolute):
                bounds.append((absolute, "absolute"))
            broken = [(b, rule) for b, rule in bounds if reward > b + 1e-9]
            if broken:
                bound, rule = min(broken)
                failures.append(
                    AuditFailure(
                        exploit=exploit,
                        stage=stage,
                        reward=reward,
                        naive=base,
                        bound=bound,
                        rule=rule,
                    )
                )
    return tuple(failures)


class AuditReport(BaseModel):
    """The audit of one benchmark: the mean-reward table, the failures, every episode."""

    model_config = _STRICT

    benchmark: str
    version: str
    stages: tuple[str, ...] = Field(description="The table's columns, S1..S5 then E2E-heldout.")
    exploits: tuple[str, ...] = Field(description="The exploit rows, in the order played.")
    references: tuple[str, ...] = Field(description="naive and teacher, where defined.")
    means: dict[str, dict[str, float | None]] = Field(description="policy -> stage -> mean.")
    margin: float
    absolute: float
    failures: tuple[AuditFailure, ...]
    waived: tuple[WaivedBound, ...] = Field(
        (), description="Bounds not applied on a stage row, each with its reason."
    )
    episodes: tuple[AuditEpisode, ...]
    notes: tuple[str, ...] = ()
    settings: dict[str, Any] = Field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """No exploit beats the targets."""
        return not self.failures

    def table(self) -> str:
        """The policy x stage table as aligned text; ``!`` marks a cell that beats the targets."""
        failed = {(f.exploit, f.stage) for f in self.failures}
        width = max(len(p) for p in (*self.exploits, *self.references, "policy"))
        cols = [max(len(s), 6) for s in self.stages]
        head = f"{'policy':{width}s}  " + "  ".join(
            f"{s:>{w}s}" for s, w in zip(self.stages, cols, strict=True)
        )
        lines = [head]
        for policy in (*self.exploits, *self.references):
            cells = []
            for stage, w in zip(self.stages, cols, strict=True):
                value = self.means.get(policy, {}).get(stage)
                text = "-" if value is None else f"{value:.3f}"
                text += "!" if (policy, stage) in failed else " "
                cells.append(f"{text:>{w + 1}s}")
            lines.append(f"{policy:{width}s} " + " ".join(cells))
            if self.exploits and policy == self.exploits[-1] and self.references:
                lines.append("-" * len(head))
        if failed:  # the legend of a mark that is there
            lines.append(
                f"! beats the targets: more than {self.margin:.2f} above naive, or above "
                f"{self.absolute:.2f} on a stage row"
            )
        lines += [f"waived: {w.describe()}" for w in self.waived]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def summary(self) -> str:
        """One line: how many cells beat the targets, and the worst of them."""
        total = sum(
            self.means.get(e, {}).get(s) is not None for e in self.exploits for s in self.stages
        )
        if self.ok:
            return f"{self.benchmark}: OK, none of {total} exploit cells beats the targets"
        worst = max(self.failures, key=lambda f: f.reward - f.bound)
        return (
            f"{self.benchmark}: FAIL, {len(self.failures)} of {total} exploit cells beat the "
            f"targets; worst: {worst.describe()}"
        )

    def item_rates(self, policy: str, stage: str) -> dict[str, float]:
        """Share of scored episodes in which each rubric item passed (nulls left out)."""
        counts: dict[str, list[bool]] = defaultdict(list)
        for e in self.episodes:
            if e.policy == policy and e.stage == stage and e.valid:
                for item, passed in e.items.items():
                    if passed is not None:
                        counts[item].append(passed)
        return {item: sum(v) / len(v) for item, v in counts.items()}

    def explain(self) -> str:
        """For each failure, the credit items the exploit passed, with their pass rates.

        Guards and gates are left out where they always passed; one that ever failed is
        listed with its (lower) pass rate.
        """
        lines = []
        for f in self.failures:
            rates = self.item_rates(f.exploit, f.stage)
            guards = {g for e in self.episodes if e.policy == f.exploit for g in e.guards}
            shown = [f"{i} {r:.2f}" for i, r in rates.items() if _worth_showing(i, r, guards)]
            lines.append(f"{f.describe()}\n    passed: {', '.join(shown) or 'none'}")
        return "\n".join(lines)


def _worth_showing(item: str, rate: float, guards: set[str]) -> bool:
    """A credit item that ever passed; a guard or gate that ever failed."""
    if item in guards or item.startswith("gate."):
        return rate < 1
    return rate > 0


def admitted(state: Any) -> bool:
    """Whether a bank row was admitted by a demonstration (it stores one)."""
    return bool((state.provenance.get("demonstration") or {}).get("blob"))


def _states(source: Any, focus: str | None = None) -> Iterator[Any]:
    """The rows of ``source`` with ``focus``, leaving out planned rows it did not admit."""
    for state_id in source.select(focus=focus):
        with contextlib.suppress(StateNotAdmitted):
            yield source.get(state_id)


def sample_states(
    source: Any, focus: str, n: int, *, tracks: Sequence[str] = (), seed: int = 0
) -> list[Any]:
    """``n`` admitted states of ``focus`` from a state source, spread over tracks; deterministic.

    Only rows a demonstration won are sampled (:func:`admitted`): a row no honest play
    wins pays only a policy that gets around it, so an exploit's reward there says
    nothing about the reward the bank trains with. Each track's state ids are shuffled
    with a generator seeded by ``(seed, focus)`` and the tracks taken in turn (in a
    shuffled order), so that ``n`` states cover as many tracks, and across tracks as
    many outcomes, as they can. Only the states walked past are fetched: from the
    lazily built default states (:func:`bat_gym.bank.default_states`) an audit builds
    the trajectories it samples, not the whole grid. Name ``tracks`` for that; without
    them every state of ``focus`` is read to learn its track.
    """
    rng = random.Random(f"{seed}/{focus}")
    by_track = _ids_by_track(source, focus, tracks)
    order = sorted(by_track)
    rng.shuffle(order)
    for track in order:
        rng.shuffle(by_track[track])
    picked: list[Any] = []
    while len(picked) < n and any(by_track.values()):
        for track in order:
            while by_track[track] and len(picked) < n:
                state = _admitted_state(source, by_track[track].pop(0))
                if state is not None:
                    picked.append(state)
                    break
    return picked


def _ids_by_track(source: Any, focus: str, tracks: Sequence[str]) -> dict[str, list[str]]:
    """The ids of ``source``'s ``focus`` states per track (only ``tracks``, if named)."""
    if tracks:
        return {t: ids for t in tracks if (ids := list(source.select(focus=focus, track=t)))}
    by_track: dict[str, list[str]] = defaultdict(list)
    for state in _states(source, focus):
        by_track[state.track].append(state.state_id)
    return dict(by_track)


def _admitted_state(source: Any, state_id: str) -> Any | None:
    """The state, or None when a demonstration did not win it."""
    try:
        state = source.get(state_id)
    except StateNotAdmitted:
        return None
    return state if admitted(state) else None


def _episode_line(e: AuditEpisode) -> str:
    """One finished audit episode, as the progress display lists it."""
    score = "INVALID" if not e.valid else "null" if e.reward is None else f"{e.reward:.3f}"
    return f"{e.policy:21s} {e.stage:11s} {e.track:14s} reward {score:7s} {e.wall_s:5.1f} s"


def _episode(
    policy: str, stage: str, state: Any, where: str, info: dict[str, Any], wall_s: float
) -> AuditEpisode:
    verdict = info["verdict"]
    items: dict[str, bool | None] = {}
    details: dict[str, str] = {}
    guards = []
    for s in verdict.stages:
        for item in s.items:
            key = f"{s.stage}.{item.id}"
            items[key] = item.passed
            details[key] = item.detail[:240]
            if item.guard:
                guards.append(key)
    for g in verdict.gates:
        items[f"gate.{g.gate}"] = g.passed
        details[f"gate.{g.gate}"] = g.reason[:240]
    return AuditEpisode(
        policy=policy,
        stage=stage,
        track=state.track,
        where=where,
        reward=verdict.reward,
        task=verdict.task_score,
        items=items,
        details=details,
        guards=tuple(guards),
        notes=tuple(verdict.notes)
        + ((f"rejected: {verdict.rejected}",) if verdict.rejected else ()),
        wall_s=wall_s,
    )


def _play_stage_rows(
    bench: Benchmark,
    jobs: list[tuple[str, Policy, Any]],
    make_env: Callable[[], Any],
    workers: int,
    progress: display.ProgressTask,
) -> list[AuditEpisode]:
    """Play each (policy name, policy, state) once, ``workers`` at a time.

    An episode that cannot be played (the runner's retry rule, two attempts) is an
    invalid row, never a reward.
    """
    from bat_gym.evaluation.harness import infrastructure_error, play_episode
    from bat_gym.rollout import Runner

    runner = Runner(make_env, workers=workers, max_attempts=2, name="bat-audit")

    def play(job: tuple[str, Policy, Any]) -> AuditEpisode:
        name, policy, state = job

        def once(env: Any) -> AuditEpisode:
            start = time.perf_counter()
            info, _ = play_episode(env, policy, state, bench)
            wall_s = time.perf_counter() - start
            return _episode(name, state.focus, state, state.state_id, info, wall_s)

        played = runner.attempt(once, what=f"{name} on {state.state_id}")
        e = played.value
        if played.error is not None:
            e = AuditEpisode(
                policy=name,
                stage=state.focus,
                track=state.track,
                where=state.state_id,
                reward=None,
                valid=False,
                error=infrastructure_error(played.error),
            )
        progress.count(_episode_line(e))
        return e

    try:
        return runner.map(play, jobs)
    finally:
        runner.close()


class _VerdictTap(gym.Wrapper):
    """Passes every call through; at an episode's end hands its state and info to ``sink``."""

    def __init__(self, env: Any, sink: Callable[[Any, dict[str, Any]], None]) -> None:
        super().__init__(env)
        self.sink = sink

    def step(self, action: Any) -> Any:  # noqa: D102
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            self.sink(self.env.unwrapped.state, info)
        return obs, reward, terminated, truncated, info


def _play_heldout(
    bench: Benchmark,
    policies: dict[str, Policy],
    cfg: Any,
    work: Path,
    progress: display.ProgressTask,
) -> list[AuditEpisode]:
    """Every held-out cell for every policy, through the evaluation harness.

    The envs are the harness's own (a rubric-wrapped E2E StageEnv on the held-out start
    states), with a tap that keeps each episode's verdict for the item table.
    """
    from bat_gym.env import StageEnv
    from bat_gym.evaluation.harness import held_out_cells, run_cells
    from bat_gym.rubrics.verifier.reward import RubricReward

    cells = held_out_cells(bench, cfg)
    out: list[AuditEpisode] = []
    for name, policy in policies.items():
        seen: dict[tuple[str, int], AuditEpisode] = {}

        def sink(state: Any, info: dict[str, Any], name: str = name, seen: dict = seen) -> None:
            e = _episode(name, HELDOUT, state, state.task_id, info, 0.0)
            seen[(state.track, state.provenance["seed"])] = e  # one cell per (track, seed)
            progress.count(_episode_line(e))

        def make_env(source: Any, sink: Callable = sink) -> Any:
            env = StageEnv(
                "E2E",
                benchmark=bench,
                states=source,
                backend=cfg.backend,
                protocol=cfg.protocol,
                budgets=cfg.budgets or bench.spec.budgets,
                sandbox_options=cfg.sandbox_options,
            )
            return _VerdictTap(RubricReward(env), sink)

        for result in run_cells(bench, policy, cells, work / name, cfg, make_env=make_env):
            tapped = seen.get((result.cell.track, result.cell.seed))
            if result.valid and tapped is not None:
                update = {
                    "where": result.cell.key,
                    "reward": result.reward,
                    "wall_s": result.wall_s,
                }
                out.append(tapped.model_copy(update=update))
                continue
            lost = AuditEpisode(
                policy=name,
                stage=HELDOUT,
                track=result.cell.track,
                where=result.cell.key,
                reward=None,
                valid=False,
                error=result.error or "the episode ended without a verdict",
            )
            progress.count(_episode_line(lost))
            out.append(lost)
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _means(episodes: Sequence[AuditEpisode]) -> dict[str, dict[str, float | None]]:
    """Policy -> stage -> mean reward: over states on a stage row, over tracks on E2E-heldout."""
    from bat_gym.rubrics.verifier.scoring import aggregate

    scored: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for e in episodes:
        if e.valid and e.reward is not None:
            scored[e.policy][e.stage][e.track].append(e.reward)
    means: dict[str, dict[str, float | None]] = {}
    for policy, stages in scored.items():
        means[policy] = {
            stage: aggregate(tracks)
            if stage == HELDOUT
            else _mean([r for rewards in tracks.values() for r in rewards])
            for stage, tracks in stages.items()
        }
    return means


def audit_reward(
    benchmark: str | Benchmark | None,
    *,
    exploits: Sequence[str] | None = None,
    states: Any = None,
    states_per_focus: int = 2,
    heldout_cells: int = 1,
    tracks: Sequence[str] = (),
    margin: float = 0.10,
    absolute: float = 0.35,
    backend: str = "local",
    workers: int = 2,
    seed: int = 0,
    progress: bool = True,
) -> AuditReport:
    """Play every exploit, the naive baseline and the teacher; judge the exploits' rewards.

    Args:
        benchmark: a registered name, an instance, or None for the default benchmark.
        exploits: exploit names (default: every registered one, :func:`exploit_names`).
        states: where stage states come from: a bank directory or a
            :class:`~bat_gym.bank.StateSource`; default: the benchmark's default bank.
        states_per_focus: stage states sampled per focus S1..S5 (0: no stage rows).
        heldout_cells: held-out E2E cells per track (0: no E2E column).
        tracks: only these tracks, for states and cells alike (default: every track).
        margin: an exploit fails when its mean exceeds the naive baseline's by more.
        absolute: an exploit fails when its mean on a stage row exceeds this.
        backend: sandbox backend, ``"local"`` or ``"docker"``.
        workers: episodes played at once, one sandbox each.
        seed: seed of the state sample.
        progress: report episodes done / total, and a line per finished episode, to
            the current progress reporter (:mod:`bat_gym.core.progress`).

    Returns:
        The report; ``report.ok`` is False when some exploit beats the targets.

    Raises:
        UnknownExploit: an exploit name is not registered.
        ValueError: a size is negative, or a bound is outside [0, 1].
    """
    from bat_gym.audits.exploits import exploit_names, make_exploit
    from bat_gym.bank import StageBank, default_states
    from bat_gym.catalog import get_benchmark
    from bat_gym.env import StageEnv
    from bat_gym.evaluation.harness import EvalConfig
    from bat_gym.policies.scripted import ScriptedPolicy
    from bat_gym.rubrics.verifier.reward import RubricReward

    if states_per_focus < 0 or heldout_cells < 0:
        raise ConfigError(
            f"sizes must be >= 0, got states_per_focus={states_per_focus}, heldout_cells={heldout_cells}"
        )
    if not (0 <= margin <= 1 and 0 <= absolute <= 1):
        raise ConfigError(f"margin and absolute must be in [0, 1], got {margin} and {absolute}")
    t0 = time.perf_counter()
    bench = benchmark if isinstance(benchmark, Benchmark) else get_benchmark(benchmark)
    tracks = tuple(bench.spec.track(t).name for t in tracks)
    names = list(exploits) if exploits else exploit_names()
    policies: dict[str, Policy] = {n: make_exploit(n) for n in names}
    notes = []
    if callable(getattr(bench, "naive_turns", None)):
        policies[NAIVE] = ScriptedPolicy("naive")
    else:
        notes.append(
            f"{bench.name} defines no naive baseline (Benchmark.naive_turns): no margin test; "
            f"E2E-heldout is held to the absolute bound"
        )
    policies[TEACHER] = ScriptedPolicy("teacher")
    stage_ids = [s.id for s in bench.spec.stages]

    jobs: list[tuple[str, Policy, Any]] = []
    source: Any = None
    if states_per_focus:
        if states is None:
            # Built lazily: the audit builds the teacher trajectories it samples.
            source = default_states(bench)
        else:
            source = StageBank(states) if isinstance(states, (str, Path)) else states
        named = tracks or tuple(t.name for t in bench.spec.tracks)
        sample = [
            st
            for focus in stage_ids
            for st in sample_states(source, focus, states_per_focus, tracks=named, seed=seed)
        ]
        # A bank built before admission by demonstration holds rows without one.
        built = isinstance(source, StageBank)
        unproven = sum(not admitted(st) for st in _states(source)) if built else 0
        if unproven:
            notes.append(
                f"{unproven} row(s) of the states hold no demonstration (a bank built before "
                "admission by demonstration, bank format 7) and were not sampled; rebuild it"
            )
        jobs = [(n, p, st) for st in sample for n, p in policies.items()]
    cfg = EvalConfig(
        repeats=max(heldout_cells, 1),
        tracks=tracks,
        workers=workers,
        backend=backend,
        progress=False,
    )
    n_cells = len(cfg.tracks or bench.spec.tracks) * heldout_cells
    tracker = display.task(
        "reward audit: episodes", len(jobs) + n_cells * len(policies), shown=progress
    )

    def make_env() -> Any:
        return RubricReward(StageEnv("E2E", benchmark=bench, states=source, backend=backend))

    try:
        episodes = _play_stage_rows(bench, jobs, make_env, workers, tracker) if jobs else []
        if heldout_cells:
            with tempfile.TemporaryDirectory(prefix="bat-audit-") as work:
                episodes += _play_heldout(bench, policies, cfg, Path(work), tracker)
    finally:
        tracker.close()

    columns = [*stage_ids] if jobs else []
    columns += [HELDOUT] if heldout_cells else []
    means = _means(episodes)
    refs = tuple(p for p in (NAIVE, TEACHER) if p in policies)
    return AuditReport(
        benchmark=bench.name,
        version=bench.spec.version,
        stages=tuple(columns),
        exploits=tuple(names),
        references=refs,
        means={p: {s: means.get(p, {}).get(s) for s in columns} for p in (*names, *refs)},
        margin=margin,
        absolute=absolute,
        failures=judge(means, names, columns, margin=margin, absolute=absolute),
        waived=waived_bounds(means, columns, absolute=absolute),
        episodes=tuple(episodes),
        notes=tuple(notes),
        settings={
            "states_per_focus": states_per_focus,
            "heldout_cells_per_track": heldout_cells,
            "tracks": list(tracks),
            "backend": backend,
            "workers": workers,
            "seed": seed,
            "bank": str(getattr(source, "root", "")) or None,
        },
        wall_s=time.perf_counter() - t0,
    )
