"""Does GRPO raise the reward of the state it trains on? The recipe of the slow test, by seed.

The set-up of ``tests/trainers/test_learning.py``, built on the spot: a skill_ladder
Stage Bank (8 tasks per track, success and recovery), a byte-level BPE tokenizer
trained on its rows, a random-init 128-wide model (:mod:`bat_gym.trainers.tiny_model`)
and 150 SFT steps on the teacher rows. Then, for each ``--seeds``, GRPO on the first
``units`` E2E success state, and that state's mean rubric reward over the same
``--episodes`` keyed episodes (each draws by its own seed key) before and after: the
baseline is the SFT checkpoint on the very same draws, so only the policy differs.

    python benchmarks/grpo_one_state.py                           # the test's recipe, 3 seeds
    python benchmarks/grpo_one_state.py --steps 10 --lr 1e-4 --group-size 4

Tool results name no run time and every sampled turn is keyed, so a rerun on the same
machine repeats every figure. About 7 min per seed at the defaults on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

BENCH = "skill_ladder"
MAX_TURNS = 8
MAX_NEW_TOKENS = 96
TEMPERATURE = 0.7


def build(out: Path) -> tuple[Any, Path]:
    """The bank and the SFT checkpoint of :mod:`bat_gym.trainers.tiny_sft` (reused if built)."""
    from bat_gym.bank import StageBank
    from bat_gym.trainers.tiny_sft import build_tiny_setup, train_tiny_sft

    final = out / "sft-run" / "final"
    if (final / "config.json").is_file():
        return StageBank(out / "bank"), final
    setup = build_tiny_setup(out, BENCH, tasks_per_track=8)
    return setup.bank, train_tiny_sft(setup, out / "sft-run", steps=150)


def state_rewards(bank: Any, model: Path, state_id: str, n: int) -> list[float]:
    """Rubric rewards of ``n`` keyed episodes from ``state_id`` (GRPO's own rollouts)."""
    from bat_gym.catalog import get_benchmark
    from bat_gym.trainers import tiny_sft

    budgets = get_benchmark(BENCH).spec.budgets.model_copy(update={"max_turns": MAX_TURNS})
    return tiny_sft.state_rewards(
        bank,
        model,
        state_id,
        n,
        seed=1,
        budgets=budgets,
        temperature=TEMPERATURE,
        max_new_tokens=MAX_NEW_TOKENS,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/grpo-one-state"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GRPO seeds")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--groups", type=int, default=2, help="groups per step (all of the state)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--overlong", default="mask", choices=["mask", "keep", "penalize"])
    p.add_argument("--episodes", type=int, default=64, help="keyed episodes per measurement")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = p.parse_args(argv)

    import torch

    from bat_gym.trainers.grpo import GRPOConfig, train

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bank, sft = build(args.out)
    state_id = next(s for s in bank.select("E2E", "units") if s.endswith(".success"))
    print(f"set-up (bank, tokenizer, 150 SFT steps): {time.perf_counter() - t0:.0f} s")
    before = state_rewards(bank, sft, state_id, args.episodes)
    base = statistics.fmean(before)
    recipe = (
        f"{args.steps} steps x {args.groups} groups x {args.group_size} rollouts, lr {args.lr:g}, "
        f"overlong={args.overlong}"
    )
    print(f"\nGRPO on {state_id}: {recipe}; {args.episodes} keyed episodes per measurement")
    print(
        "| seed | SFT (baseline) | after GRPO | gain | training reward, first -> last quarter | s |"
    )
    print("|---|---|---|---|---|---|")
    gains = []
    for seed in args.seeds:
        t = time.perf_counter()
        cfg = GRPOConfig(
            model=str(sft),
            output_dir=str(args.out / f"grpo-seed{seed}-{args.steps}x{args.group_size}"),
            benchmark=BENCH,
            bank=str(bank.root),
            state_ids=(state_id,),
            steps=args.steps,
            groups_per_step=args.groups,
            group_size=args.group_size,
            temperature=TEMPERATURE,
            max_new_tokens=MAX_NEW_TOKENS,
            max_turns=MAX_TURNS,
            overlong=args.overlong,
            lr=args.lr,
            warmup_steps=min(3, args.steps),
            kl_coef=0.006,
            num_envs=8,
            device="cpu",
            save_every=10**6,
            seed=seed,
        )
        result = train(cfg)
        after = statistics.fmean(
            state_rewards(bank, Path(result["final"]), state_id, args.episodes)
        )
        rewards = [h["reward"] for h in result["history"]]
        q = max(1, len(rewards) // 4)
        gains.append(after - base)
        print(
            f"| {seed} | {base:.3f} | {after:.3f} | {after - base:+.3f} | "
            f"{statistics.fmean(rewards[:q]):.2f} -> {statistics.fmean(rewards[-q:]):.2f} | "
            f"{time.perf_counter() - t:.0f} |",
            flush=True,
        )
    print(f"\nmean gain {statistics.fmean(gains):+.3f} over {len(gains)} seeds")
    (args.out / "gains.json").write_text(json.dumps({"recipe": recipe, "gains": gains}))


if __name__ == "__main__":
    main()
