"""MedBench-Lite scored by its rubric contracts on held-out tasks: teacher, naive, random, heuristics.

For every track and each of the first N held-out seeds, three policies play one E2E
episode in a real sandbox (``StageEnv`` wrapped in ``RubricReward``), each started from
the task's own start state (``bat_gym.bank.task_states``; held-out tasks are in no
bank):

* teacher: ``bench.teacher_turns(task)``, the scripted careful engineer;
* naive:   ``bench.naive_turns(task)``, no plan, setup or validation, the model's
  default convention;
* random:  ``env.action_space.sample()`` until the episode ends.

Per track it prints the mean over seeds of Overall (``overall_score(task, agentic)``
with the spec's task weight), the task score and each stage's credit, and the wall
time of the first teacher episode (reset, every step, and the verdict). The last row
per policy averages the track means (tracks are the units). The same table follows
per difficulty tier (``params["difficulty"]``; held-out seeds alternate easy, hard).

Then, per track and tier, the task score of every model-free heuristic of the track
(:func:`bat_gym.envs.medbench_lite.heuristics.heuristics`, scored offline with the
track's metric by ``score_heuristic``) beside the teacher's and the naive baseline's,
with the bound that keeps the provided model necessary:
``heuristic - naive <= 0.5 * (teacher - naive)`` (``ok`` or ``OVER``).

    python benchmarks/medbench_scores.py [--seeds 2] [--tracks segmentation,vqa]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bat_gym.bank import task_states
from bat_gym.benchmark import TeacherTurn
from bat_gym.catalog import get_benchmark
from bat_gym.core.protocol import get_protocol
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import Task
from bat_gym.env import StageEnv
from bat_gym.envs.medbench_lite.heuristics import heuristics, score_heuristic
from bat_gym.rubrics.verifier.reward import RubricReward
from bat_gym.rubrics.verifier.scoring import aggregate, overall_score
from bat_gym.rubrics.verifier.verdict import Verdict

STAGES = ("S1", "S2", "S3", "S4", "S5")
POLICIES = ("teacher", "naive", "random")
HERMES = get_protocol("hermes")


def play_turns(env: RubricReward, turns: list[TeacherTurn]) -> Verdict:
    """Step scripted turns until the episode ends; the verdict of its last step."""
    for turn in turns:
        _, _, terminated, truncated, info = env.step(HERMES.render(turn.content, list(turn.calls)))
        if terminated or truncated:
            return info["verdict"]
    raise RuntimeError("the scripted turns ended without finishing the episode")


def play_random(env: RubricReward, seed: int) -> Verdict:
    """Step random text (the action space's samples) until the episode ends."""
    env.action_space.seed(seed)
    while True:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            return info["verdict"]


def row(verdict: Verdict, spec) -> dict[str, float | None]:
    """Overall, task and stage credits of one E2E verdict (None: unscored)."""
    credits = {s.stage: s.credit for s in verdict.stages}
    return {
        "overall": overall_score(verdict.task_score, verdict.stage_score, spec),
        "task": verdict.task_score,
        **{s: credits.get(s) for s in STAGES},
    }


def mean(values: list[float | None]) -> float | None:
    """Mean of the scored values; None when none is scored."""
    scored = [v for v in values if v is not None]
    return float(np.mean(scored)) if scored else None


def fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:5.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2, help="held-out seeds per track")
    parser.add_argument("--tracks", default="", help="comma-separated tracks (default: all)")
    parser.add_argument("--backend", default="local")
    args = parser.parse_args()

    bench = get_benchmark("medbench_lite")
    spec = bench.spec
    tracks = [t for t in args.tracks.split(",") if t] or [t.name for t in spec.tracks]
    seeds = list(bench.seeds("heldout"))[: args.seeds]
    results: dict[str, dict[str, list[dict[str, float | None]]]] = {p: {} for p in POLICIES}
    tiers: dict[str, list[str]] = {}  # per track, each seed's tier, in results' order
    shortcut: dict[tuple[str, str], list[float | None]] = {}  # (track, heuristic) -> scores
    wall: dict[str, float] = {}

    with tempfile.TemporaryDirectory(prefix="medbench-scores-") as tmp:
        store = BlobStore(Path(tmp) / "store")
        source = task_states(bench, [(t, s) for t in tracks for s in seeds], "heldout", store)
        env = RubricReward(StageEnv("E2E", benchmark=bench, states=source, backend=args.backend))
        try:
            for track in tracks:
                for n, state_id in enumerate(source.select(track=track)):
                    state = source.get(state_id)
                    task: Task = bench.make_task(track, state.provenance["seed"], "heldout")
                    tiers.setdefault(track, []).append(str(task.params.get("difficulty", "-")))
                    for name, h in heuristics(track).items():
                        shortcut.setdefault((track, name), []).append(
                            score_heuristic(bench, task, h)
                        )
                    policies: dict[str, Callable[[], Verdict]] = {
                        "teacher": lambda task=task: play_turns(env, bench.teacher_turns(task)),
                        "naive": lambda task=task: play_turns(env, bench.naive_turns(task)),
                        "random": lambda task=task: play_random(env, task.seed),
                    }
                    for policy, play in policies.items():
                        start = time.perf_counter()
                        env.reset(options={"state_id": state_id})
                        verdict = play()
                        if policy == "teacher" and n == 0:
                            wall[track] = time.perf_counter() - start
                        results[policy].setdefault(track, []).append(row(verdict, spec))
        finally:
            env.close()

    print(f"MedBench-Lite, held-out seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} per track)")
    every = sorted({t for ts in tiers.values() for t in ts})
    for tier in (None, *every):
        table(results, tracks, tiers, tier, wall)
    bounds(results, shortcut, tracks, tiers, every)


def _pick(rows: list, track_tiers: list[str], tier: str | None) -> list:
    """The rows of one tier (all of them for ``tier`` None)."""
    return [r for r, t in zip(rows, track_tiers, strict=True) if tier is None or t == tier]


def table(results, tracks, tiers, tier, wall) -> None:
    """One table per policy: per track means over seeds (of one tier, or all)."""
    header = f"{'track':15s} {'Overall':>7s} {'Task':>5s} " + " ".join(f"{s:>5s}" for s in STAGES)
    print(f"\n######## {'all tiers' if tier is None else 'tier ' + tier}")
    for policy in POLICIES:
        timed = policy == "teacher" and tier is None
        print(f"\n== {policy} " + ("(teacher E2E episode wall time)" if timed else ""))
        print(header + ("   wall s" if timed else ""))
        per_track: dict[str, list[float | None]] = {}
        for track in tracks:
            rows = _pick(results[policy][track], tiers[track], tier)
            if not rows:
                continue
            cells = {k: mean([r[k] for r in rows]) for k in ("overall", "task", *STAGES)}
            per_track[track] = [r["overall"] for r in rows]
            line = f"{track:15s} {fmt(cells['overall']):>7s} {fmt(cells['task'])} " + " ".join(
                fmt(cells[s]) for s in STAGES
            )
            if timed:
                line += f"   {wall[track]:6.2f}"
            print(line)
        overall = aggregate(per_track)
        print(f"{'mean of tracks':15s} {fmt(overall):>7s}")


def bounds(results, shortcut, tracks, tiers, every) -> None:
    """Task scores of teacher, naive, random and each heuristic, with the bound check."""
    print("\n######## model-free heuristics: task score, bound h - naive <= 0.5 (teacher - naive)")
    print(
        f"{'track':15s} {'tier':5s} {'teacher':>7s} {'naive':>6s} {'random':>6s}  "
        f"{'heuristic':18s} {'score':>6s} {'bound':>6s}"
    )
    for track in tracks:
        for tier in every:
            t, nv, rnd = (
                mean([r["task"] for r in _pick(results[p][track], tiers[track], tier)])
                for p in POLICIES
            )
            if t is None:
                continue
            names = sorted(n for tr, n in shortcut if tr == track) or ["(none)"]
            for name in names:
                h = mean(_pick(shortcut.get((track, name), []), tiers[track], tier))
                bound = None if nv is None else nv + 0.5 * (t - nv)
                ok = "" if h is None or bound is None else ("ok" if h <= bound + 1e-9 else "OVER")
                print(
                    f"{track:15s} {tier:5s} {fmt(t):>7s} {fmt(nv):>6s} {fmt(rnd):>6s}  "
                    f"{name:18s} {fmt(h):>6s} {fmt(bound):>6s} {ok}"
                )


if __name__ == "__main__":
    main()
