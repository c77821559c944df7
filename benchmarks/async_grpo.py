"""Asynchronous GRPO against the synchronous trainer: wall time per step, and who waits.

One tiny Qwen3-style model (built on the spot, nothing downloaded) trains with
``bat_gym.trainers.grpo.train`` on skill_ladder, three times from the same weights and
seed: synchronously (``max_staleness=0``: sample, then update) and asynchronously with
``max_staleness`` K = 1 and K = 2 (``num_envs`` background slots sample with the last
published weights while the trainer updates). Every run has the same batch (B groups of G
episodes), turn budget and tokens per turn; the random model never closes a turn, so
every turn is cut at ``max_new_tokens`` and acted on (``cut_turn="act"``), and each
step trains on the same number of sampled tokens (the table shows it).

Tool time: a real tool call (a build, a test run, a DICOM query) takes seconds, the toy
tools here microseconds. The benchmark (only it) makes every env step sleep
``--tool-latency`` seconds (default 1) first, so the rollouts wait on tools as real ones
do. That wait is where asynchrony pays: the trainer updates while episodes wait on their
tools.

Envs: every run gets ``--num-envs`` (default 2 x B x G) envs. The synchronous trainer
plays one batch at a time and leaves half of them unused; asynchronously, batch j + 1
may start (K = 1) while batch j still plays, so with R the rollout time of a batch and
U the update time a step takes about max(U, (R + U) / 2) instead of R + U (batch j + 1
starts when the update before batch j ends). With ``--num-envs`` equal to B x G the
batches take turns on the envs and a step is at least R.

Reported per run, over the steady steps (the first step, which fills the pipeline and
loads the models, is left out):

* ``s/step``: wall time per optimizer step, and its ratio to the synchronous run's;
* ``trainer idle``: share of the wall time the trainer waited for rollouts
  (synchronous: the rollout time; asynchronous: the wait in ``next_batch``);
* ``generator idle``: share of the wall time no episode was being played
  (synchronous: the update time; asynchronous: every slot waiting at the staleness bound);
* ``update s``: seconds of the update per step (it grows when sampling runs beside it);
* ``cpu s/step``: CPU seconds this process used per step, all threads: the work is the
  same in every run, so when ``s/step`` is close to it over the cores available, the run
  is bound by CPU, not by waiting;
* ``tokens/step``: sampled tokens trained on per step (equal across runs by construction);
* ``dropped``: groups dropped as staler than K (0 expected: the producer never runs
  further ahead than the bound).

CPU contention: the update and the sampling both run on this machine's CPU cores. On a
GPU box they overlap on separate engines (the vLLM generator, the trainer); here they
share the cores, so the overlap can only hide the tool wait (and the time either side
leaves cores free), not the compute: with U the update, Rc the sampling compute and Rs the
tool wait of a step, synchronous is U + Rc + Rs, asynchronous at best max(U + Rc, Rc + Rs)
on a saturated CPU (max(U, Rc + Rs) with cores to spare). When both idle shares are near
0 the asynchronous run is CPU-bound, and others' load on the machine sets the figure.

The runs go round by round (sync, K = 1, K = 2, then again), so that load from other
processes falls on each alike; the table gives medians over the rounds, and each ratio is
taken within its round. The default (one round of 4 steps per run) takes about two
minutes on two CPU cores; ``--long`` runs 3 rounds of 8 steps.

Usage: python benchmarks/async_grpo.py [--long] [--rounds N] [--steps N] [--tool-latency S]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bat_gym.trainers.grpo import GRPOConfig, train


def progress(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def inject_tool_latency(seconds: float) -> None:
    """Make every env step of this process sleep ``seconds`` first (the benchmark's tool time)."""
    from bat_gym.env import StageEnv

    step = StageEnv.step

    def slow_step(self: StageEnv, action: Any) -> Any:
        time.sleep(seconds)
        return step(self, action)

    StageEnv.step = slow_step  # type: ignore[method-assign]


def build_setup(out: Path, hidden: int, layers: int) -> tuple[Path, Path, list[str]]:
    """The skill_ladder bank, a random-init tiny model, and the E2E states to train on."""
    from bat_gym.bank import build_bank
    from bat_gym.catalog import get_benchmark
    from bat_gym.trainers.tiny_model import build_tiny_model

    bench = get_benchmark("skill_ladder")
    bank = build_bank(bench, out / "bank", tasks_per_track=1, outcomes=("success",))
    states = list(bank.select(focus="E2E"))
    texts = [m.get("content") or "" for i in states for m in bank.get(i).messages]
    rng = random.Random(0)
    texts += [" ".join(rng.choices(texts[0].split() or ["x"], k=40)) for _ in range(50)]
    model = build_tiny_model(
        out / "model", texts, vocab_size=1024, hidden_size=hidden, num_layers=layers
    )
    return Path(bank.root), Path(model), states


def run(
    args: argparse.Namespace, k: int, bank: Path, model: Path, states: list[str], out: Path
) -> dict[str, Any]:
    """One training run with ``max_staleness=k``; its steady-state figures."""
    cfg = GRPOConfig(
        model=str(model), output_dir=str(out), benchmark="skill_ladder", bank=str(bank),
        state_ids=tuple(states), steps=args.steps, groups_per_step=args.groups,
        group_size=args.group_size, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
        num_envs=args.num_envs or 2 * args.groups * args.group_size,
        micro_batch_size=args.groups * args.group_size,
        cut_turn="act", overlong="keep", lr=1e-4, seed=0, save_every=10**6, keep_last=1,
        max_staleness=k, device="cpu", bf16="off", kl_coef=0.006, sampler_gap_alarm_at=None,
    )  # fmt: skip
    stamps: list[float] = []
    cpu: list[float] = []
    records: list[dict[str, Any]] = []

    def on_step(record: dict[str, Any]) -> None:
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
        records.append(record)
        progress(
            f"K={k} step {record['step']}: {stamps[-1] - (stamps[-2] if len(stamps) > 1 else t0):.2f} s"
        )

    t0 = time.perf_counter()
    train(cfg, on_step=on_step)
    steady = records[1:]
    wall = stamps[-1] - stamps[0]
    if k == 0:
        trainer_idle = sum(r["rollout_s"] for r in steady)
        generator_idle = sum(r["update_s"] for r in steady)
    else:
        trainer_idle = sum(r["trainer_idle_s"] for r in steady)
        generator_idle = sum(r["generator_idle_s"] for r in steady)
    return {
        "k": k,
        "s_per_step": wall / len(steady),
        "cpu_per_step": (cpu[-1] - cpu[0]) / len(steady),
        "trainer_idle": trainer_idle / wall,
        "generator_idle": generator_idle / wall,
        "tokens": sum(r["response_tokens"] * r["scored_rollouts"] for r in steady) / len(steady),
        "dropped": sum(r.get("stale_dropped_groups", 0) for r in steady),
        "staleness": sum(r.get("staleness_mean", 0.0) for r in steady) / len(steady),
        "update_s": sum(r["update_s"] for r in steady) / len(steady),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per run (default 4)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of (sync, K=1, K=2) runs (default 1)"
    )
    parser.add_argument(
        "--long", action="store_true", help="3 rounds of 8 steps (about 15 minutes)"
    )
    parser.add_argument(
        "--tool-latency", type=float, default=1.0, help="seconds per env step (default 1.0)"
    )
    parser.add_argument(
        "--ks", default="0,1,2", help="max_staleness values, 0 first (default 0,1,2)"
    )
    parser.add_argument("--groups", type=int, default=2, help="B, groups per step (default 2)")
    parser.add_argument(
        "--group-size", type=int, default=4, help="G, episodes per group (default 4)"
    )
    parser.add_argument("--max-turns", type=int, default=3, help="turns per episode (default 3)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=16, help="tokens per turn (default 16)"
    )
    parser.add_argument(
        "--num-envs", type=int, default=None,
        help="episodes played at once (default 2 x B x G, so two batches can play at once)",
    )  # fmt: skip
    parser.add_argument("--hidden", type=int, default=128, help="model width (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.long:
        args.steps, args.rounds = 8, 3
    ks = [int(x) for x in args.ks.split(",")]
    if ks[0] != 0 or args.steps < 2 or args.rounds < 1:
        parser.error("--ks must start with 0 (the baseline), --steps be >= 2, --rounds >= 1")
    inject_tool_latency(args.tool_latency)
    rounds: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bat-async-grpo-") as tmp:
        root = Path(tmp)
        progress("building the skill_ladder bank and the tiny model")
        bank, model, states = build_setup(root, args.hidden, args.layers)
        for n in range(args.rounds):
            # Round by round, so that load from other processes falls on every K alike.
            rounds.append([run(args, k, bank, model, states, root / f"run-{n}-k{k}") for k in ks])
    print(
        f"GRPO on skill_ladder, tiny model ({args.hidden} wide, {args.layers} layers), "
        f"B={args.groups} x G={args.group_size}, {args.num_envs or 2 * args.groups * args.group_size} "
        f"envs, {args.max_turns} turns x {args.max_new_tokens} "
        f"tokens, tool latency {args.tool_latency} s/step, {args.rounds} round(s) of "
        f"{args.steps} steps per run (steady: {args.steps - 1}), torch threads "
        f"{torch.get_num_threads()}; medians over rounds, ratios taken within a round"
    )
    print(
        f"{'run':<10}{'s/step':>8}{'vs sync':>9}{'trainer idle':>14}{'generator idle':>16}"
        f"{'update s':>10}{'cpu s/step':>12}{'tokens/step':>13}{'staleness':>11}{'dropped':>9}"
    )
    for i, k in enumerate(ks):
        runs = [r[i] for r in rounds]

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        ratio = statistics.median(r[i]["s_per_step"] / r[0]["s_per_step"] for r in rounds)
        name = "sync" if k == 0 else f"K={k}"
        print(
            f"{name:<10}{med('s_per_step'):>8.2f}{ratio:>8.2f}x"
            f"{med('trainer_idle'):>14.0%}{med('generator_idle'):>16.0%}{med('update_s'):>10.2f}"
            f"{med('cpu_per_step'):>12.2f}{med('tokens'):>13.0f}{med('staleness'):>11.2f}"
            f"{sum(int(r['dropped']) for r in runs):>9d}"
        )


if __name__ == "__main__":
    main()
