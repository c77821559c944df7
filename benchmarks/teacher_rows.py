"""The scripted teacher played from every stage state of each suite's default bank.

For each suite (toy_pipeline, skill_ladder, medbench_lite, and radiology when the
Orthanc server is installed; otherwise it is skipped with the install command), every
stage row (S1..S5, every track and outcome) of the benchmark's default bank
(:func:`bat_gym.bank.default_bank`, built on first use) is played once by the teacher
as ``bat-gym audit-reward`` plays it (``ScriptedPolicy("teacher")`` in a
``RubricReward(StageEnv("E2E", states=bank))``), and scored by the row's own contract.

It prints one line per (suite, focus, outcome): the rows, the teacher's mean reward,
and the rows below 0.9 (the bar a row must clear to be admitted). With ``--why`` it
then lists each such row with the rubric items that failed and their details.

    python benchmarks/teacher_rows.py [--suites toy_pipeline,skill_ladder] [--focus S4,S5]
        [--outcomes failure] [--tracks units] [--workers 2] [--why]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

SUITES = ("toy_pipeline", "skill_ladder", "medbench_lite", "radiology")
BAR = 0.9  # a row is admitted when its demonstration earns at least this share


@dataclass(frozen=True)
class Row:
    """One stage row played by the teacher: where, the reward, and what failed."""

    suite: str
    state_id: str
    focus: str
    track: str
    outcome: str
    reward: float | None
    failed: tuple[str, ...] = field(default=())
    seconds: float = 0.0


def available(suite: str) -> str | None:
    """None when ``suite`` can run here, else why not (with the install command)."""
    if suite != "radiology":
        return None
    from bat_gym.envs.radiology.orthanc import OrthancMissing, find_orthanc

    try:
        find_orthanc()
    except OrthancMissing as exc:
        return str(exc)
    return None


def failed_items(verdict: Any) -> tuple[str, ...]:
    """``stage.item: detail`` for every rubric item and gate the verdict failed."""
    out = [
        f"{s.stage}.{i.id}: {i.detail[:200]}"
        for s in verdict.stages
        for i in s.items
        if i.passed is False
    ]
    out += [f"gate.{g.gate}: {g.reason[:200]}" for g in verdict.gates if not g.passed]
    if verdict.rejected:
        out.append(f"rejected: {verdict.rejected}")
    return tuple(out)


def play_suite(
    suite: str,
    focuses: list[str],
    outcomes: list[str],
    tracks: list[str],
    workers: int,
) -> list[Row]:
    """Play the teacher once from every selected stage row of ``suite``'s default bank."""
    import threading

    from bat_gym.bank import default_bank
    from bat_gym.catalog import get_benchmark
    from bat_gym.env import StageEnv
    from bat_gym.evaluation.harness import play_episode
    from bat_gym.policies.scripted import ScriptedPolicy
    from bat_gym.rubrics.verifier.reward import RubricReward

    bench = get_benchmark(suite)
    bank = default_bank(bench, workers=workers)
    stages = [s.id for s in bench.spec.stages]
    states = [
        bank.get(i)
        for focus in stages
        if not focuses or focus in focuses
        for i in bank.select(focus=focus)
    ]
    states = [
        s
        for s in states
        if (not outcomes or s.outcome in outcomes) and (not tracks or s.track in tracks)
    ]
    local = threading.local()
    envs: list[Any] = []
    teacher = ScriptedPolicy("teacher")

    def play(state: Any) -> Row:
        if not hasattr(local, "env"):
            local.env = RubricReward(StageEnv("E2E", benchmark=bench, states=bank))
            envs.append(local.env)
        start = time.perf_counter()
        info, _ = play_episode(local.env, teacher, state, bench)
        verdict = info["verdict"]
        return Row(
            suite=suite,
            state_id=state.state_id,
            focus=state.focus,
            track=state.track,
            outcome=state.outcome,
            reward=verdict.reward,
            failed=failed_items(verdict),
            seconds=time.perf_counter() - start,
        )

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(play, states))
    finally:
        for env in envs:
            env.close()


def table(rows: list[Row]) -> str:
    """Per (suite, focus, outcome): rows, mean reward, rows below the bar; then totals."""
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.suite, r.focus, r.outcome)].append(r)
    lines = [f"{'suite':14s} {'focus':5s} {'outcome':9s} {'rows':>4s} {'mean':>6s} {'<0.9':>5s}"]
    for (suite, focus, outcome), group in sorted(groups.items()):
        rewards = [r.reward or 0.0 for r in group]
        low = sum(x < BAR for x in rewards)
        lines.append(
            f"{suite:14s} {focus:5s} {outcome:9s} {len(group):4d} "
            f"{sum(rewards) / len(rewards):6.3f} {low:5d}"
        )
    for suite in sorted({r.suite for r in rows}):
        rewards = [r.reward or 0.0 for r in rows if r.suite == suite]
        low = sum(x < BAR for x in rewards)
        lines.append(
            f"{suite:14s} {'all':5s} {'all':9s} {len(rewards):4d} "
            f"{sum(rewards) / len(rewards):6.3f} {low:5d}"
        )
    rewards = [r.reward or 0.0 for r in rows]
    if rewards:
        lines.append(
            f"{'total':14s} {'':5s} {'':9s} {len(rewards):4d} "
            f"{sum(rewards) / len(rewards):6.3f} {sum(x < BAR for x in rewards):5d}"
        )
    return "\n".join(lines)


def why(rows: list[Row]) -> str:
    """Each row below the bar with the items it failed."""
    out = []
    for r in sorted(rows, key=lambda r: (r.suite, r.focus, r.outcome, r.state_id)):
        if (r.reward or 0.0) < BAR:
            reward = "null" if r.reward is None else f"{r.reward:.3f}"
            out.append(f"{r.suite} {r.state_id} reward {reward}")
            out += [f"    {f}" for f in r.failed] or ["    (no failed item)"]
    return "\n".join(out)


def main() -> None:
    """Parse the flags, play every selected row, print the table (and the reasons)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suites", default=",".join(SUITES), help="comma-separated suites")
    p.add_argument("--focus", default="", help="only these stages, e.g. S4,S5")
    p.add_argument("--outcomes", default="", help="only these outcomes, e.g. failure")
    p.add_argument("--tracks", default="", help="only these tracks")
    p.add_argument("--workers", type=int, default=2, help="episodes played at once")
    p.add_argument("--why", action="store_true", help="list the failed items of rows < 0.9")
    args = p.parse_args()

    def split(s: str) -> list[str]:
        return [x for x in s.split(",") if x]

    rows: list[Row] = []
    t0 = time.perf_counter()
    for suite in split(args.suites):
        if (reason := available(suite)) is not None:
            print(f"skip {suite}: {reason}")
            continue
        rows += play_suite(
            suite, split(args.focus), split(args.outcomes), split(args.tracks), args.workers
        )
    print(table(rows))
    if args.why:
        print()
        print(why(rows))
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
