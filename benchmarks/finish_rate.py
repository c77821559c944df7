"""Why does GRPO stop finishing? Measure the finish rate, and what the reward pays for it.

Two measurements on a tiny local model (skill_ladder, built on the spot by
:func:`bat_gym.trainers.tiny_sft.build_tiny_setup`: bank, tokenizer, random-init model,
cold-start SFT; ``--sft`` reuses a checkpoint):

1. ``rows``: does a row pay the same whether or not the episode finishes? Every row of
   the bank (``--focus`` to pick) is played twice with its stored demonstration (the
   teacher's work, then ``finish``): once as stored, once without the ``finish`` turn
   and with empty turns until the turn budget ends the episode (``stop_reason ==
   "turn_budget"``). Prints how many rows pay the same both ways. No model involved.
2. ``grpo``: GRPO on ``--target`` from the SFT checkpoint, once per ``--arm`` and seed
   (:data:`ARMS`: ``keep`` trains on every unfinished episode's reward as scored and
   masks the ones a token limit cut, the behaviour before ``unfinished`` existed;
   ``penalize`` subtracts ``unfinished_penalty`` from the budget-ended ones;
   ``penalize-all`` also subtracts ``overlong_penalty`` from the cut ones, the
   defaults). Per run: the training finish rate and cut share per step (from
   ``metrics.jsonl``), the kept rollouts by how they ended, then a held-out evaluation
   (E2E episodes on held-out seeds, :func:`bat_gym.evaluation.evaluate`) with the
   episodes that called ``finish``, overall and the target stage, against the SFT
   checkpoint's. Seeds are common random numbers: the arms sample the same episodes
   until their updates first change a sampled token.

    python benchmarks/finish_rate.py rows --out runs/finish
    python benchmarks/finish_rate.py grpo --out runs/finish --steps 10 --arm keep penalize penalize-all

A rerun with the same ``--out`` reuses the bank, the SFT run, finished GRPO runs and
finished evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

BENCH = "skill_ladder"
MAX_TURNS = 8  # the teacher needs at most 7; tiny policies waste little on dead ends
MAX_NEW_TOKENS = 96
TEMPERATURE = 0.7
SFT_STEPS = 300

# The GRPO settings of the learnability runs for the 128-wide model: lr 1e-4 with a
# four-step warmup moved S3 without breaking the other stages there.
GRPO_BASE: dict[str, Any] = {
    "lr": 1e-4,
    "warmup_steps": 4,
    "group_size": 4,
    "groups_per_step": 8,
    "temperature": TEMPERATURE,
    "max_new_tokens": MAX_NEW_TOKENS,
    "max_turns": MAX_TURNS,
    "kl_coef": 0.006,
    "num_envs": 8,
    "micro_batch_size": 8,
    "device": "cpu",
    "save_every": 1000,
    "keep_last": 1,
}


# The arms: how episodes that did not finish are trained on. ``keep`` is the behaviour
# before ``unfinished`` existed; ``penalize`` its default; ``penalize-all`` also penalises
# the episodes a token limit cut (``overlong="penalize"``) instead of masking them.
ARMS: dict[str, dict[str, str]] = {
    "keep": {"unfinished": "keep", "overlong": "mask"},
    "penalize": {"unfinished": "penalize", "overlong": "mask"},
    "penalize-all": {"unfinished": "penalize", "overlong": "penalize"},
}


def _log(msg: str) -> None:
    print(msg, flush=True)


# -------------------------------------------------------------------------- rows


def _play(env: Any, row: Any, texts: list[str]) -> tuple[float, str | None]:
    """Play ``texts`` from ``row`` (then empty turns until the episode ends); reward, stop."""
    from bat_gym.core.completion import Completion
    from bat_gym.rollout import run_episode

    pending = iter(texts)

    def act(_: dict[str, Any]) -> Completion:
        # Past the script: a turn that calls no tool, so only the turn budget ends it.
        return Completion(next(pending, "Waiting."), 1)

    end = run_episode(env, act, state_id=row.state_id, on_restart="ignore")
    return float(end.reward or 0.0), end.info.get("stop_reason")


def measure_rows(bank_root: Path, max_turns: int, focuses: list[str]) -> dict[str, Any]:
    """Each row's reward with its demonstration finished, and left to the turn budget.

    ``focuses``: only rows of these focuses (empty: every row, E2E ones included).
    """
    from bat_gym.bank import StageBank
    from bat_gym.bank.demonstrate import load_demonstration
    from bat_gym.catalog import get_benchmark
    from bat_gym.core.protocol import get_protocol
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.verifier.reward import RubricReward

    bench = get_benchmark(BENCH)
    bank = StageBank(bank_root)
    proto = get_protocol("hermes")  # the protocol the bank's demonstrations are written in
    budgets = bench.spec.budgets.model_copy(update={"max_turns": max_turns})
    env = RubricReward(StageEnv("E2E", benchmark=bench, states=bank, budgets=budgets))
    rows: list[dict[str, Any]] = []
    try:
        for state_id in bank.select():
            row = bank.get(state_id)
            turns = load_demonstration(bank.store, row)
            if not turns or (focuses and row.focus not in focuses):
                continue
            texts = [t.text for t in turns]
            finished = _play(env, row, texts)
            # The same work, without the finish call: the last turn is the finish turn.
            calls = proto.parse(texts[-1]).calls
            if not any(c.name == "finish" for c in calls) or len(calls) > 1:
                continue  # a last turn that also works cannot be split off cleanly
            unfinished = _play(env, row, texts[:-1])
            rows.append(
                {
                    "state_id": state_id,
                    "focus": row.focus,
                    "finished": finished,
                    "unfinished": unfinished,
                }
            )
    finally:
        env.close()
    same = [r for r in rows if abs(r["finished"][0] - r["unfinished"][0]) < 1e-9]
    return {"rows": rows, "same": len(same), "compared": len(rows)}


def section_rows(out: Path, setup: Any, focuses: list[str]) -> None:
    t0 = time.perf_counter()
    result = measure_rows(Path(setup.bank.root), MAX_TURNS, focuses)
    name = "rows.json" if not focuses else f"rows-{'-'.join(focuses)}.json"
    (out / name).write_text(json.dumps(result, indent=1))
    rows = result["rows"]
    _log(
        f"\n## Rows: reward when the demonstration finishes vs. when the turn budget "
        f"ends it ({result['compared']} rows, {time.perf_counter() - t0:.0f} s)"
    )
    _log(
        "| focus | rows | same reward | mean finished | mean unfinished | stop reasons (unfinished) |"
    )
    _log("|---|---|---|---|---|---|")
    for focus in sorted({r["focus"] for r in rows}):
        sel = [r for r in rows if r["focus"] == focus]
        same = sum(abs(r["finished"][0] - r["unfinished"][0]) < 1e-9 for r in sel)
        stops = sorted({str(r["unfinished"][1]) for r in sel})
        _log(
            f"| {focus} | {len(sel)} | {same} | "
            f"{statistics.fmean(r['finished'][0] for r in sel):.3f} | "
            f"{statistics.fmean(r['unfinished'][0] for r in sel):.3f} | {', '.join(stops)} |"
        )


# -------------------------------------------------------------------------- grpo


def held_out(model: Path | str, out: Path, repeats: int, seed: int = 0) -> Any:
    """Held-out E2E evaluation of a checkpoint (tracks as units)."""
    from bat_gym.catalog import get_benchmark
    from bat_gym.evaluation import EvalConfig, evaluate_spec

    bench = get_benchmark(BENCH)
    cfg = EvalConfig(
        repeats=repeats,
        workers=6,
        progress=False,
        budgets=bench.spec.budgets.model_copy(update={"max_turns": MAX_TURNS}),
    )
    return evaluate_spec(
        bench,
        f"hf:{model}",
        out,
        cfg,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        seed=seed,
        max_batch_size=6,
    )


def grpo_run(
    sft: Path, bank: Path, out: Path, target: str, steps: int, seed: int, arm: str
) -> Path:
    """One GRPO run (or the finished one in ``out``); its final model directory."""
    from bat_gym.trainers.grpo import GRPOConfig, train

    if (out / "final" / "config.json").is_file():
        return out / "final"
    cfg = GRPOConfig(
        model=str(sft),
        output_dir=str(out),
        benchmark=BENCH,
        bank=str(bank),
        target=target,
        steps=steps,
        seed=seed,
        **ARMS[arm],
        **{**GRPO_BASE, "warmup_steps": min(GRPO_BASE["warmup_steps"], steps)},
    )
    return Path(train(cfg)["final"])


def _train_finish(run: Path) -> list[dict[str, Any]]:
    """Per step: the finish rate overall and per pool, and the share a budget ended."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        out.append(
            {
                "step": m["step"],
                "finished": m["finished"],
                "by_pool": m.get("finished_by_pool", {}),
                "budget_cut": m.get("budget_cut"),
                "length_cut": m["length_cut"],
                "reward_by_pool": m["reward_by_pool"],
            }
        )
    return out


def _by_ending(run: Path) -> dict[str, dict[str, float]]:
    """The kept rollouts of a run by how they ended: count, mean reward, mean sampled tokens.

    Under ``seq_mean_token_mean`` every token of rollout ``i`` is weighted ``A_i / |o_i|``,
    so the ratio of the mean lengths says how much less, per token, a long (unfinished)
    rollout is pushed than a short (finished) one with the same advantage.
    """
    ends: dict[str, list[tuple[float, int]]] = {}
    for path in sorted((run / "rollouts").glob("step_*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            ends.setdefault(r["stop_reason"], []).append((r["reward"], r["sampled_tokens"]))
    return {
        stop: {
            "n": len(v),
            "reward": statistics.fmean(x for x, _ in v),
            "tokens": statistics.fmean(t for _, t in v),
        }
        for stop, v in sorted(ends.items())
    }


def _summary(report: Any, target: str) -> dict[str, Any]:
    a = report.aggregates
    return {
        "overall": a.overall,
        "target": a.stages.get(target),
        "finished": a.completion.finished,
        "runs": a.completion.runs,
    }


def section_grpo(out: Path, setup: Any, sft: Path, args: argparse.Namespace) -> None:
    _log(f"\n## GRPO on {args.target}: {args.steps} steps x 8 groups x 4, held-out E2E")
    base = None
    if not args.no_baseline:  # a second process running other arms beside this one
        base = _summary(held_out(sft, out / "eval" / "sft", args.eval_repeats), args.target)
        _log(
            f"SFT: overall {base['overall']:.3f}, {args.target} {base['target']:.3f}, "
            f"finished {base['finished']}/{base['runs']}"
        )
    _log(
        "| arm | seed | train finished, first -> last 3 steps | held-out finished | overall | target | s |"
    )
    _log("|---|---|---|---|---|---|---|")
    results = {"sft": base, "runs": []}
    for arm in args.arm:
        for seed in args.seeds:
            t0 = time.perf_counter()
            run = out / "grpo" / f"{args.target}-{arm}-seed{seed}"
            final = grpo_run(sft, Path(setup.bank.root), run, args.target, args.steps, seed, arm)
            ev = _summary(
                held_out(
                    final, out / "eval" / f"{args.target}-{arm}-seed{seed}", args.eval_repeats
                ),
                args.target,
            )
            steps = _train_finish(run)
            last = statistics.fmean(s["finished"] for s in steps[-3:])
            ends = _by_ending(run)
            results["runs"].append(
                {"arm": arm, "seed": seed, "eval": ev, "steps": steps, "by_ending": ends}
            )
            _log(
                f"| {arm} | {seed} | {steps[0]['finished']:.2f} -> {last:.2f} | "
                f"{ev['finished']}/{ev['runs']} | {ev['overall']:.3f} | {ev['target']:.3f} | "
                f"{time.perf_counter() - t0:.0f} |"
            )
            _log(
                "    kept rollouts by ending: "
                + ", ".join(
                    f"{stop} n={e['n']} reward {e['reward']:.3f} tokens {e['tokens']:.0f}"
                    for stop, e in ends.items()
                )
            )
            name = "grpo.json" if len(args.arm) > 1 else f"grpo-{arm}.json"
            (out / name).write_text(json.dumps(results, indent=1, default=str))


# -------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["rows", "grpo"])
    p.add_argument("--out", type=Path, default=Path("runs/finish"))
    p.add_argument("--target", default="S3")
    p.add_argument("--focus", nargs="*", default=[], help="rows: only these focuses")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--arm", nargs="*", default=["keep", "penalize"], choices=list(ARMS))
    p.add_argument("--eval-repeats", type=int, default=16, help="held-out tasks per track")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sft", type=Path, help="an SFT checkpoint to start from (default: train one)")
    p.add_argument("--no-baseline", action="store_true", help="skip the SFT evaluation")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("BAT_GYM_CACHE", str(args.out.resolve() / "cache"))
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from bat_gym.trainers.tiny_sft import build_tiny_setup, train_tiny_sft

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    setup = build_tiny_setup(args.out, BENCH, tasks_per_track=8)
    _log(f"setup (bank, tokenizer, model): {time.perf_counter() - t0:.0f} s")
    if args.what == "rows":
        section_rows(args.out, setup, args.focus)
        return
    # --sft: a cold-start checkpoint from an earlier run (the SFT takes the longest here).
    sft = args.sft or train_tiny_sft(setup, args.out / "sft", steps=SFT_STEPS)
    _log(f"SFT ready: {time.perf_counter() - t0:.0f} s")
    section_grpo(args.out, setup, sft, args)
    _log(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
