"""Does a staged benchmark teach? SFT, GRPO, BiCuRL and a pool ablation with a tiny local model.

Everything is built on the spot: a Stage Bank of the benchmark's training tasks
(``--benchmark``, skill_ladder by default), a
byte-level BPE tokenizer trained on its prompts and teacher turns, and a random-init
Qwen3-style model (:mod:`bat_gym.trainers.tiny_model`); nothing is downloaded. Every
score is a held-out rubric evaluation (:func:`bat_gym.evaluation.evaluate`: E2E
episodes on held-out seeds, tracks as units).

Sections (each prints a table):

1. SFT: held-out overall / task / stage scores of the random-init model and of the
   model after cold-start SFT on the bank's teacher rows.
2. GRPO on the weakest stage: the SFT checkpoint is evaluated ``--noise-evals`` times
   with different sampling seeds (the evaluation noise: std over those, and the bootstrap
   CI of one evaluation); ``--target`` picks the weakest stage (default: the weighted
   deficit of :class:`bat_gym.curriculum.selection.DeficitSelector`; ``paper``: the lowest
   score); GRPO with ``target=`` that stage runs for ``--grpo-steps`` steps per seed;
   the stage's held-out score before and after, mean and spread over seeds, and each
   run's training reward on the target pool.
3. BiCuRL: :func:`bat_gym.trainers.bicurl.run_loop` for ``--rounds`` rounds, with its
   promotion gate and best-so-far retention; each round's decision and the curve PNG.
4. Pool ablation: GRPO with the reference three-pool mix (section 2's runs) against
   an E2E-only pool at the same rollout budget (steps x groups x group size), same
   seeds; held-out overall and the target stage.

    python benchmarks/learnability.py --quick          # the short version (~1.5 h)
    python benchmarks/learnability.py --out runs/learn # the full version (~3 h)

Any registered benchmark runs through the same code (``--benchmark medbench_lite``);
the sizes above are skill_ladder's, whose teacher turns are short. A suite whose turns
are whole scripts needs ``--max-new-tokens`` to match, and a tiny model learns little
of it: that run checks the loop end to end on the suite's real sandboxes and rubrics.

Times are for two CPU cores; a GRPO step (8 groups x 4 rollouts) takes about 35 s
there, most of it rollouts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# -------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Plan:
    """Sizes of one run; ``--quick`` shrinks the evaluations and the GRPO runs."""

    tasks_per_track: int = 8
    """Training tasks per track in the bank (success and recovery trajectories each).
    With 24, the 300 SFT steps left the model undertrained (S4 0.22 held-out, against
    0.54 with 8)."""
    sft_steps: int = 300
    """Cold-start SFT optimizer steps (micro batch 4, no accumulation, lr 2e-3)."""
    eval_repeats: int = 48
    """Held-out tasks per track in every evaluation (skill_ladder's 3 tracks: 3x this many
    episodes)."""
    noise_evals: int = 5
    """Evaluations of the SFT checkpoint with different sampling seeds (the noise)."""
    grpo_steps: int = 32
    """GRPO optimizer steps per run (section 2 and both ablation arms)."""
    groups_per_step: int = 8
    """States per GRPO step: one StageCurriculum batch of 8 rows."""
    seeds: int = 3
    """GRPO seeds (section 2 and the ablation)."""
    rounds: int = 3
    """BiCuRL rounds."""
    steps_per_round: int = 12
    """GRPO steps per BiCuRL round."""


QUICK = Plan(
    tasks_per_track=8,
    sft_steps=300,
    eval_repeats=16,
    noise_evals=3,
    grpo_steps=16,
    groups_per_step=8,
    seeds=3,
    rounds=3,
    steps_per_round=8,
)

BENCH = "skill_ladder"  # --benchmark
MAX_TURNS = 8  # the teacher needs at most 7; tiny policies waste little on dead ends
MAX_NEW_TOKENS = 96  # --max-new-tokens; a skill_ladder teacher turn is about 50 tokens
TEMPERATURE = 0.7  # the BaT sampling temperature, in training and evaluation alike

# GRPO for a 128-wide model; the rest is BaT. After 300 SFT steps the policy is sharp
# (token entropy ~0.04): lr 3e-4 moved it ~0.1 nats/token from the SFT model within
# three steps and broke S2-S5 on held-out tasks. 3e-5 kept KL below 0.02 but left the
# target stage where SFT put it (S3 -0.02, 0.4 SE, over three seeds); on one training
# state, tests/trainers/test_learning.py needs 2e-4 to move the reward beyond noise.
# 1e-4 with a four-step warmup sits between (--lr to change it).
GRPO_BASE: dict[str, Any] = {
    "lr": 1e-4,
    "warmup_steps": 4,
    "group_size": 4,
    "temperature": TEMPERATURE,
    "max_new_tokens": MAX_NEW_TOKENS,
    "max_turns": MAX_TURNS,
    "kl_coef": 0.006,
    "num_envs": 8,
    "micro_batch_size": 8,
    "device": "cpu",
    "save_every": 1000,  # one checkpoint at the end: these runs are never resumed
    "keep_last": 1,
}


def _log(msg: str) -> None:
    print(msg, flush=True)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _var(xs: list[float]) -> float:
    return statistics.variance(xs) if len(xs) > 1 else 0.0


def _mean_sd(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.fmean(xs):.3f} ± {_var(xs) ** 0.5:.3f}"


# -------------------------------------------------------------------------- evaluation


def held_out(model: Path | str, out: Path, plan: Plan, seed: int = 0) -> Any:
    """Held-out evaluation of a checkpoint; the :class:`~bat_gym.evaluation.EvalReport`."""
    from bat_gym.catalog import get_benchmark
    from bat_gym.evaluation import EvalConfig, evaluate
    from bat_gym.policies import make_policy

    bench = get_benchmark(BENCH)
    policy = make_policy(
        f"hf:{model}",
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        seed=seed,
        max_batch_size=6,
    )
    cfg = EvalConfig(
        repeats=plan.eval_repeats,
        workers=6,  # six episodes decode in one batch: the tiny model is batch-bound
        progress=False,
        budgets=bench.spec.budgets.model_copy(update={"max_turns": MAX_TURNS}),
    )
    try:
        return evaluate(bench, policy, out, cfg)
    finally:
        policy.close()


def _eval_s(report: Any) -> float:
    """Seconds an evaluation took, over every invocation (also on a rerun that reused it)."""
    return float(report.manifest["timing"]["wall_s"])


def grpo(model: Path, bank: Path, out: Path, plan: Plan, seed: int, **kw: Any) -> Path:
    """One GRPO run from ``model``; the final model directory."""
    from bat_gym.trainers.grpo import GRPOConfig, train

    cfg = GRPOConfig(
        model=str(model),
        output_dir=str(out),
        benchmark=BENCH,
        bank=str(bank),
        steps=plan.grpo_steps,
        groups_per_step=plan.groups_per_step,
        seed=seed,
        **{**GRPO_BASE, "warmup_steps": min(GRPO_BASE["warmup_steps"], plan.grpo_steps), **kw},
    )
    if (out / "final" / "config.json").is_file():
        return out / "final"
    return Path(train(cfg)["final"])


# -------------------------------------------------------------------------- sections


def section_sft(out: Path, plan: Plan, setup: Any) -> tuple[Path, Any]:
    """Before/after SFT on held-out cells; the SFT checkpoint and its evaluation (seed 0)."""
    from bat_gym.trainers.sft import train
    from bat_gym.trainers.tiny_sft import tiny_sft_config

    before = held_out(setup.init, out / "eval" / "init", plan)
    cfg = tiny_sft_config(setup, out / "sft", steps=plan.sft_steps, keep_last=1)
    t1 = time.perf_counter()
    done = out / "sft" / "summary.json"
    if done.is_file():  # a rerun reuses the finished SFT run
        summary = json.loads(done.read_text())
    else:
        summary = train(cfg)
        summary["wall_s"] = time.perf_counter() - t1
        done.write_text(json.dumps(summary, default=str))
    t_sft = summary["wall_s"]
    final = Path(summary["final_dir"])
    after = held_out(final, out / "eval" / "sft-0", plan)

    a, b = before.aggregates, after.aggregates
    _log(f"\n## 1. SFT on the bank's teacher rows (held-out, {b.completion.runs} episodes)")
    _log(
        f"steps {summary['step']}, {summary['seconds_per_step'] or 0:.2f} s/step, "
        f"SFT {t_sft:.0f} s; loss {summary['train_loss'][0]:.2f} -> "
        f"{summary['train_loss'][-1]:.3f}; evaluation {_eval_s(before):.0f} s / {_eval_s(after):.0f} s"
    )
    _log("| metric | random init | after SFT | 95% CI after |")
    _log("|---|---|---|---|")
    for m in ("overall", "task", "S1", "S2", "S3", "S4", "S5"):
        v0 = a.overall if m == "overall" else a.task if m == "task" else a.stages.get(m)
        v1 = b.overall if m == "overall" else b.task if m == "task" else b.stages.get(m)
        ci = after.intervals[m]
        _log(f"| {m} | {_fmt(v0)} | {_fmt(v1)} | [{_fmt(ci.low)}, {_fmt(ci.high)}] |")
    _log(f"| finished | {a.completion.finished} | {b.completion.finished} | |")
    return final, after


def pick_target(rule: str, scores: dict[str, float]) -> str:
    """The weakest stage of ``scores`` by ``rule``: ``paper``, ``deficit`` or a stage id.

    ``paper`` is BaT's rule (lowest stage score). In a ladder the later stages inherit
    every earlier failure, so the lowest score often sits at S5 although the episodes
    that fail there already failed at S3; ``deficit`` weighs each shortfall by the
    stage's agentic weight and finds the stage that costs the most reward.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.curriculum.selection import DeficitSelector, paper_target

    if rule == "paper":
        return paper_target(scores)
    if rule == "deficit":
        return DeficitSelector.from_spec(get_benchmark(BENCH).spec).target(scores)
    return rule


def _run_log(run: Path) -> tuple[float, float, float]:
    """From a GRPO run's ``metrics.jsonl``: the mean target-pool rollout reward of the
    first and last quarter of its steps, and its seconds (rollouts plus updates; also
    right when a rerun reuses the finished run)."""
    from bat_gym.trainers.grpo_metrics import read_metrics

    steps = read_metrics(run.parent / "metrics.jsonl")
    rewards = [m.reward_by_pool.get("target", m.reward) for m in steps]
    k = max(1, len(rewards) // 4)
    seconds = sum(m.rollout_s + m.update_s for m in steps)
    return statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:]), seconds


def section_grpo(
    out: Path,
    plan: Plan,
    sft: Path,
    sft_eval: Any,
    bank: Path,
    rule: str,
    max_staleness: int = 0,
) -> tuple[str, list[Any]]:
    """GRPO on the weakest stage over seeds, against the evaluation noise.

    ``sft_eval`` is section 1's evaluation of ``sft`` (sampling seed 0), the first of
    the noise evaluations. ``max_staleness`` > 0 trains asynchronously (its runs are
    named ``<target>-k<K>-seed<n>``, so a rerun with K set compares against the
    synchronous runs in the same ``--out``). Returns the target and each seed's
    held-out evaluation.
    """
    from bat_gym.curriculum.selection import paper_target

    reports = [sft_eval] + [
        held_out(sft, out / "eval" / f"sft-{s}", plan, seed=s) for s in range(1, plan.noise_evals)
    ]
    t_noise = sum(_eval_s(r) for r in reports)
    stages = list(reports[0].aggregates.stages)
    # Stage scores averaged over the sampling seeds: the least noisy view we have.
    mean_scores = {
        s: statistics.fmean(v for r in reports if (v := r.aggregates.stages[s]) is not None)
        for s in stages
        if any(r.aggregates.stages[s] is not None for r in reports)
    }
    target = pick_target(rule, mean_scores)
    base = [r.aggregates.stages[target] or 0.0 for r in reports]
    base_overall = [r.aggregates.overall or 0.0 for r in reports]
    ci = reports[0].intervals[target]

    trained, logs = [], []
    name = f"{target}-k{max_staleness}" if max_staleness else target
    for seed in range(plan.seeds):
        final = grpo(
            sft,
            bank,
            out / "grpo" / f"{name}-seed{seed}",
            plan,
            seed,
            target=target,
            max_staleness=max_staleness,
        )
        trained.append(held_out(final, out / "eval" / f"grpo-{name}-seed{seed}", plan))
        logs.append(_run_log(final))
    after = [r.aggregates.stages[target] or 0.0 for r in trained]
    after_overall = [r.aggregates.overall or 0.0 for r in trained]

    episodes = reports[0].aggregates.completion.runs
    _log(
        f"\n## 2. GRPO on the weakest stage ({target}), {plan.grpo_steps} steps x "
        f"{plan.groups_per_step} groups x {GRPO_BASE['group_size']} rollouts at lr "
        f"{GRPO_BASE['lr']:g}, {plan.seeds} seeds; every evaluation {episodes} held-out E2E "
        "episodes"
    )
    _log(
        "SFT stage scores (mean over sampling seeds): "
        + ", ".join(f"{s} {v:.3f}" for s, v in mean_scores.items())
        + f"; target by rule {rule!r}: {target} (paper rule: {paper_target(mean_scores)})"
    )
    _log(
        f"evaluation noise: {plan.noise_evals} sampling seeds of the SFT checkpoint; "
        f"{_fmt(ci.level, 2)} bootstrap CI of one evaluation [{_fmt(ci.low)}, {_fmt(ci.high)}]; "
        f"noise evals {t_noise:.0f} s, GRPO runs {statistics.fmean(t for *_, t in logs):.0f} s each"
    )
    _log(f"| | {target} (held-out) | overall (held-out) | finished | {target} per seed |")
    _log("|---|---|---|---|---|")
    for name, scores, overall, reps in (
        ("SFT (sampling seeds)", base, base_overall, reports),
        ("SFT + GRPO (training seeds)", after, after_overall, trained),
    ):
        # Finishing is not rewarded: an episode cut by the turn budget scores its artifacts.
        finished = statistics.fmean(r.aggregates.completion.finished for r in reps)
        _log(
            f"| {name} | {_mean_sd(scores)} | {_mean_sd(overall)} | {finished:.0f}/{episodes} | "
            f"{', '.join(f'{x:.3f}' for x in scores)} |"
        )
    _log(
        "training reward on the target pool, first -> last quarter of the steps: "
        + ", ".join(f"seed {i} {a:.2f} -> {b:.2f}" for i, (a, b, _) in enumerate(logs))
    )
    diff = statistics.fmean(after) - statistics.fmean(base)
    sd = _var(base) ** 0.5
    above = sum(x > max(base) for x in after)
    beyond = abs(diff) > 2 * sd and abs(diff) > 0
    # Welch's standard error of the difference of the two means: the training seeds'
    # spread holds the evaluation noise and the seed-to-seed spread of GRPO itself.
    se = (_var(base) / len(base) + _var(after) / len(after)) ** 0.5
    _log(
        f"change {diff:+.3f} on {target}; evaluation std {sd:.3f}: "
        f"{'beyond' if beyond else 'within'} 2 std of the noise; "
        f"{above}/{len(after)} seeds above every SFT evaluation; "
        f"standard error of the change {se:.3f} ("
        + (f"{diff / se:+.1f} SE)" if se else "no spread to compare against)")
    )
    return target, trained


def section_bicurl(out: Path, plan: Plan, sft: Path, bank: Path, rule: str = "deficit") -> None:
    """Three BiCuRL rounds: target, decision, best-so-far; where the curve is.

    The loop selects its targets with ``rule`` when it names a selector (``paper`` or
    ``deficit``), else with the weighted deficit.
    """
    from bat_gym.trainers.bicurl import BiCuRLConfig, run_loop

    grpo_kw = {**GRPO_BASE, "groups_per_step": plan.groups_per_step}
    cfg = BiCuRLConfig(
        model=str(sft),
        output_dir=str(out / "bicurl"),
        benchmark=BENCH,
        bank=str(bank),
        rounds=plan.rounds,
        steps_per_round=plan.steps_per_round,
        eval_repeats=plan.eval_repeats,
        eval_workers=6,
        eval_max_turns=MAX_TURNS,
        eval_max_new_tokens=MAX_NEW_TOKENS,
        eval_temperature=TEMPERATURE,
        selector=rule if rule in ("paper", "deficit") else "deficit",
        grpo=grpo_kw,
    )
    state = run_loop(cfg)
    _log(
        f"\n## 3. BiCuRL, {plan.rounds} rounds x {plan.steps_per_round} GRPO steps, "
        f"selector {cfg.selector} ({state.seconds:.0f} s)"
    )
    _log(
        "| round | target | candidate overall | incumbent overall | decision | failed checks "
        "| best so far | next |"
    )
    _log("|---|---|---|---|---|---|---|---|")
    for r in state.rounds:
        _log(
            f"| {r['round']} | {r['target']} | {_fmt(r.get('candidate_overall'))} | "
            f"{_fmt(r.get('incumbent_overall'))} | {r.get('decision')} | "
            f"{', '.join(r.get('failed_checks', [])) or '-'} | {_fmt(r.get('best_overall'))} | "
            f"{r.get('next_target')} |"
        )
    _log(f"best eligible checkpoint: {state.incumbent}")
    _log(f"round curve: {out / 'bicurl' / 'rounds.png'}; report: {out / 'bicurl' / 'report.md'}")


def section_ablation(
    out: Path, plan: Plan, sft: Path, bank: Path, target: str, mix_evals: list[Any]
) -> None:
    """Three-pool mix (section 2's runs and ``mix_evals``) vs E2E-only, same rollout budget."""
    e2e_only = {"target_per_batch": 0, "mix_per_batch": 0, "e2e_per_batch": 8}
    rows: dict[str, dict[str, list[float]]] = {"three-pool": {}, "E2E only": {}}
    for seed in range(plan.seeds):
        final = grpo(
            sft,
            bank,
            out / "grpo" / f"e2e-only-seed{seed}",
            plan,
            seed,
            target=target,
            curriculum=e2e_only,
        )
        e2e_eval = held_out(final, out / "eval" / f"grpo-e2e-only-seed{seed}", plan)
        for name, rep in (("three-pool", mix_evals[seed]), ("E2E only", e2e_eval)):
            agg = rep.aggregates
            for key, v in (
                ("overall", agg.overall),
                ("task", agg.task),
                (target, agg.stages.get(target)),
            ):
                rows[name].setdefault(key, []).append(v or 0.0)
    budget = plan.grpo_steps * plan.groups_per_step * GRPO_BASE["group_size"]
    _log(
        f"\n## 4. Pool ablation: {budget} rollouts per run, {plan.seeds} seeds "
        f"(mean ± std over seeds)"
    )
    _log(f"| pool | overall | task | {target} | overall per seed |")
    _log("|---|---|---|---|---|")
    for name, m in rows.items():
        _log(
            f"| {name} | {_mean_sd(m['overall'])} | {_mean_sd(m['task'])} | "
            f"{_mean_sd(m[target])} | {', '.join(f'{x:.2f}' for x in m['overall'])} |"
        )
    (out / "ablation.json").write_text(json.dumps(rows, indent=1))


# -------------------------------------------------------------------------- main


def _configure(benchmark: str, max_new_tokens: int) -> None:
    """Point every section at ``benchmark`` and its turn length (module settings)."""
    global BENCH, MAX_NEW_TOKENS
    from bat_gym.catalog import get_benchmark

    get_benchmark(benchmark)  # an unknown name fails here, before any work
    BENCH, MAX_NEW_TOKENS = benchmark, max_new_tokens
    GRPO_BASE["max_new_tokens"] = max_new_tokens


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run the sections in order, print their tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the short version (smaller everything)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/learnability"),
        help="work directory; a rerun reuses finished evaluations and GRPO runs",
    )
    p.add_argument("--fresh", action="store_true", help="delete --out first")
    p.add_argument("--benchmark", default=BENCH, help="registered benchmark to learn")
    p.add_argument(
        "--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="tokens per sampled turn"
    )
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--seeds", type=int, help="GRPO seeds (default: 3)")
    p.add_argument("--grpo-steps", type=int, help="GRPO steps per run")
    p.add_argument("--lr", type=float, help=f"GRPO learning rate (default {GRPO_BASE['lr']:g})")
    p.add_argument("--sft-steps", type=int, help="SFT steps")
    p.add_argument("--tasks-per-track", type=int, help="training tasks per track in the bank")
    p.add_argument("--eval-repeats", type=int, help="held-out tasks per track per evaluation")
    p.add_argument("--noise-evals", type=int, help="sampling seeds of the SFT evaluation")
    p.add_argument(
        "--target",
        default="deficit",
        help="GRPO target stage: 'deficit' (weighted shortfall, default), 'paper' "
        "(lowest stage score) or a stage id",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["bicurl", "ablation"],
        help="leave a section out (repeatable)",
    )
    p.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="train section 2's GRPO runs asynchronously with this bound (0: synchronous)",
    )
    args = p.parse_args(argv)
    _configure(args.benchmark, args.max_new_tokens)
    if args.lr is not None:
        GRPO_BASE["lr"] = args.lr

    plan = QUICK if args.quick else Plan()
    overrides = {
        "seeds": args.seeds,
        "grpo_steps": args.grpo_steps,
        "sft_steps": args.sft_steps,
        "tasks_per_track": args.tasks_per_track,
        "eval_repeats": args.eval_repeats,
        "noise_evals": args.noise_evals,
    }
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    if args.fresh and args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    # BiCuRL evaluates in child processes; they read the cache and thread settings too.
    os.environ.setdefault("BAT_GYM_CACHE", str(args.out.resolve() / "cache"))
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from bat_gym.trainers.tiny_sft import build_tiny_setup

    torch.set_num_threads(args.threads)
    _log(f"# {BENCH} learnability ({'quick' if args.quick else 'full'}): {plan}")

    t0 = time.perf_counter()
    # The bank, the random-init tiny model (its tokenizer learns the bank's prompts and
    # teacher turns) and the SFT export.
    setup = build_tiny_setup(args.out, BENCH, tasks_per_track=plan.tasks_per_track)
    bank = Path(setup.bank.root)
    _log(f"setup (bank, tokenizer, model, SFT export): {time.perf_counter() - t0:.0f} s")
    sft, sft_eval = section_sft(args.out, plan, setup)
    target, mix_evals = section_grpo(
        args.out, plan, sft, sft_eval, bank, args.target, args.max_staleness
    )
    if "bicurl" not in args.skip:
        section_bicurl(args.out, plan, sft, bank, args.target)
    if "ablation" not in args.skip:
        section_ablation(args.out, plan, sft, bank, target, mix_evals)
    _log(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
