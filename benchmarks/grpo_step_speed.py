"""Time of one GRPO optimizer step, rollouts excluded: bat_gym next to TRL and a plain loop.

One tiny Qwen3-style model (built on the spot, nothing downloaded) and one fixed
synthetic batch of multi-turn rollouts: B groups of G rollouts, each a prompt of about
600 tokens and a response of about 200 tokens made of sampled spans (loss mask 1) and
tool-observation spans (loss mask 0), rewards varying within each group. Every
implementation starts from the same weights and takes, per timed call, one optimizer
step on that batch with the same settings: temperature 0.7, k3 KL 0.006 to a frozen
reference model, clip 0.2, sequence-mean then token-mean, micro-batches of 8, gradient
clipping at 1.0, AdamW.

* ``bat_gym``: ``bat_gym.trainers.grpo.update.update`` fed the rollouts as ``EpisodeResult``
  records, i.e. what ``train`` runs per step after the rollouts: building the padded
  tensors, reference log-probabilities (and old ones when ``updates_per_batch > 1``;
  here, one pass, the current ones serve), micro-batched loss and backward, the step.
* ``trl``: TRL's ``GRPOTrainer`` (loss ``grpo``, which is seq-mean-token-mean), with the
  tensors its ``_generate_and_score_completions`` would return (``prompt_ids``,
  ``completion_ids``, ``tool_mask``, ...) built beforehand. Timed: the reference-model
  forward that ``_generate_and_score_completions`` runs (generation excluded), then
  ``training_step`` per micro-batch and the optimizer step as ``Trainer`` takes it
  (gradient clipping, ``optimizer.step``, scheduler, ``zero_grad``). On-policy, TRL
  reuses the current log-probabilities as the old ones and runs no separate forward.
* ``reference``: a plain PyTorch loop (reference forward, then forward, masked clipped
  loss, backward per micro-batch, one AdamW step), the floor. Its padded tensors, like
  TRL's, are built beforehand.

The repetitions are interleaved (A, B, C, A, B, C, ...) so that load from other
processes falls on all of them alike; the table gives medians of wall time and of this
process's CPU time (the steadier one when others load the machine). The gradient norm of
each implementation's first step (same weights, same batch) shows that they optimise
the same objective.

The defaults take about 5 minutes on two busy CPU cores (a step is 10-30 s there).

Usage: python benchmarks/grpo_step_speed.py [--repeats N] [--groups B] [--group-size G]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bat_gym.rollout import EpisodeResult
from bat_gym.trainers.configs import GRPOConfig
from bat_gym.trainers.fsdp import Dist
from bat_gym.trainers.grpo.batch import batch_tensors, chunks
from bat_gym.trainers.grpo.update import update
from bat_gym.trainers.grpo_loss import group_advantages
from bat_gym.trainers.tiny_model import build_tiny_model, random_words

TEMPERATURE = 0.7
KL_COEF = 0.006
CLIP_EPS = 0.2
MAX_GRAD_NORM = 1.0
LR = 1e-6  # small, so the repeated steps leave the weights (and the work) as they were


def progress(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


# ============================================================================ inputs


def build_model(out_dir: Path, vocab_size: int, hidden_size: int, num_layers: int) -> Path:
    """The tiny model and its tokenizer, trained on random words."""
    return build_tiny_model(
        out_dir,
        random_words(),
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
    )


def make_rollouts(
    groups: int, group_size: int, prompt_tokens: int, response_tokens: int, vocab: int, seed: int
) -> list[EpisodeResult]:
    """``groups * group_size`` multi-turn episodes, group by group.

    The rollouts of a group share their prompt (about ``prompt_tokens``, +-10% between
    groups); each response is about ``response_tokens`` (+-20%) long and alternates a
    sampled turn (20-60 tokens, mask 1) with a tool observation (10-40 tokens, mask 0).
    Token ids avoid the special tokens (0, 1, 2); rewards differ within each group.
    """
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        spread = prompt_tokens // 10
        prompt = [
            rng.randrange(3, vocab) for _ in range(prompt_tokens + rng.randint(-spread, spread))
        ]
        for _ in range(group_size):
            length = response_tokens + rng.randint(-response_tokens // 5, response_tokens // 5)
            ids: list[int] = []
            mask: list[int] = []
            spans = 0
            while len(ids) < length:  # sampled turn, observation, sampled turn, ...
                sampled = spans % 2 == 0
                span = rng.randint(20, 60) if sampled else rng.randint(10, 40)
                ids += [rng.randrange(3, vocab) for _ in range(span)]
                mask += [int(sampled)] * span
                spans += 1
            ids, mask = ids[:length], mask[:length]
            out.append(
                EpisodeResult(
                    state_id=f"state-{g}",
                    prompt_ids=prompt,
                    response_ids=ids,
                    response_mask=mask,
                    response_logprobs=[-rng.random() * 3 if m else 0.0 for m in mask],
                    reward=round(rng.random(), 2),
                    verdict=None,
                    num_turns=(spans + 1) // 2,
                    num_replies=spans // 2,
                    stop_reason="terminated",
                    messages=[],
                )
            )
    return out


def load_model(model_dir: Path, *, frozen: bool = False) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if frozen:
        model.eval().requires_grad_(False)
    return model


# ============================================================================ implementations


@dataclass
class Batch:
    """The step's inputs, shared by all implementations."""

    model_dir: Path
    tokenizer: Any
    rollouts: list[EpisodeResult]
    advantages: torch.Tensor  # (N,)
    micro_batch: int

    @property
    def tokens(self) -> int:
        """Prompt and response tokens in the batch, padding excluded."""
        return sum(len(r.prompt_ids) + len(r.response_ids) for r in self.rollouts)

    @property
    def trained_tokens(self) -> int:
        """Tokens with loss mask 1."""
        return sum(sum(r.response_mask) for r in self.rollouts)


class BatGymStep:
    """``bat_gym.trainers.grpo.update.update``, exactly as ``train`` calls it after the rollouts."""

    name = "bat_gym"

    def __init__(self, batch: Batch, out_dir: Path) -> None:
        self.batch = batch
        self.model = load_model(batch.model_dir)
        self.ref = load_model(batch.model_dir, frozen=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.0)
        self.cfg = GRPOConfig(
            model=str(batch.model_dir),
            output_dir=str(out_dir),
            state_ids=("bench",),
            temperature=TEMPERATURE,
            lr=LR,
            max_grad_norm=MAX_GRAD_NORM,
            clip_eps_low=CLIP_EPS,
            clip_eps_high=CLIP_EPS,
            kl_coef=KL_COEF,
            aggregation="seq_mean_token_mean",
            micro_batch_size=batch.micro_batch,
            device="cpu",
            bf16="off",
            # The rollouts' sampler log-probs are made up, not a sampler's: no importance
            # correction (TRL and the reference loop have none) and no gap alarm.
            tis_cap=None,
            sampler_gap_alarm_at=None,
        )

    def padded_positions(self) -> int:
        pad = self.batch.tokenizer.pad_token_id
        return sum(
            batch_tensors(self.batch.rollouts[s], pad, torch.device("cpu"))["input_ids"].numel()
            for s in chunks(len(self.batch.rollouts), self.batch.micro_batch)
        )

    def step(self) -> float:
        self.model.eval()  # as train() leaves it after the rollouts
        stats = update(
            self.model,
            self.ref,
            self.opt,
            self.batch.rollouts,
            self.batch.advantages,
            self.cfg,
            torch.device("cpu"),
            self.batch.tokenizer,
            nullcontext(),
            Dist(),
        )
        return stats["grad_norm"]


class TRLStep:
    """TRL's ``GRPOTrainer``: reference forward, ``training_step`` per micro-batch, step.

    Raises whatever TRL raises when it cannot be set up (the caller reports it).
    """

    name = "trl"

    def __init__(self, batch: Batch, out_dir: Path) -> None:
        from datasets import Dataset
        from trl import GRPOConfig as TRLConfig
        from trl import GRPOTrainer
        from trl.trainer.utils import pad

        n = len(batch.rollouts)
        if n % batch.micro_batch:
            raise ValueError(
                f"TRL needs whole micro-batches: {n} rollouts, micro-batch {batch.micro_batch}"
            )
        self.accumulation = n // batch.micro_batch
        group_size = n // len({r.state_id for r in batch.rollouts})
        args = TRLConfig(
            output_dir=str(out_dir),
            per_device_train_batch_size=batch.micro_batch,
            gradient_accumulation_steps=self.accumulation,
            num_generations=group_size,
            loss_type="grpo",  # per-sequence token mean, then the mean over sequences
            beta=KL_COEF,
            epsilon=CLIP_EPS,
            temperature=TEMPERATURE,
            use_bias_correction_kl=False,  # plain k3, as bat_gym (the factor is 1 on-policy)
            learning_rate=LR,
            weight_decay=0.0,
            max_grad_norm=MAX_GRAD_NORM,
            optim="adamw_torch",
            lr_scheduler_type="constant",
            activation_checkpointing=False,  # TRL's GRPO turns it on by default; bat_gym does not
            disable_dropout=True,
            max_completion_length=max(len(r.response_ids) for r in batch.rollouts),
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
        )
        self.model = load_model(batch.model_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trainer = GRPOTrainer(
                model=self.model,
                reward_funcs=lambda completions, **_: [0.0] * len(completions),
                args=args,
                train_dataset=Dataset.from_dict({"prompt": ["unused"] * n}),
                processing_class=batch.tokenizer,
            )
        trainer = self.trainer
        checkpointing = (
            self.model.is_activation_checkpointing
            if hasattr(type(self.model), "is_activation_checkpointing")
            else self.model.is_gradient_checkpointing
        )
        if trainer.ref_model is None or checkpointing:
            raise RuntimeError(
                "TRL was not set up as asked (no reference model, or checkpointing on)"
            )
        # The batch arrives already scored: skip the generation that _prepare_inputs would run.
        trainer._prepare_inputs = lambda inputs: inputs
        trainer.current_gradient_accumulation_steps = self.accumulation
        trainer.create_optimizer_and_scheduler(num_training_steps=1_000_000)

        # What _generate_and_score_completions returns: prompts padded on the left,
        # completions on the right, tool observations at tool_mask 0.
        pad_id = batch.tokenizer.pad_token_id
        rows = batch.rollouts
        self.inputs = {
            "prompt_ids": pad([torch.tensor(r.prompt_ids) for r in rows], pad_id, "left"),
            "prompt_mask": pad(
                [torch.ones(len(r.prompt_ids), dtype=torch.long) for r in rows], 0, "left"
            ),
            "completion_ids": pad([torch.tensor(r.response_ids) for r in rows], pad_id, "right"),
            "completion_mask": pad(
                [torch.ones(len(r.response_ids), dtype=torch.long) for r in rows], 0, "right"
            ),
            "tool_mask": pad([torch.tensor(r.response_mask) for r in rows], 1, "right"),
            "advantages": batch.advantages.clone(),
        }
        loss_mask = self.inputs["completion_mask"] * self.inputs["tool_mask"]
        self.inputs["num_items_in_batch"] = loss_mask.sum()

    def padded_positions(self) -> int:
        return self.inputs["prompt_ids"].numel() + self.inputs["completion_ids"].numel()

    def step(self) -> float:
        from trl.trainer.utils import split_tensor_dict

        trainer, x = self.trainer, self.inputs
        ids = torch.cat([x["prompt_ids"], x["completion_ids"]], dim=1)
        attention = torch.cat([x["prompt_mask"], x["completion_mask"]], dim=1)
        keep = x["completion_ids"].size(1)
        with torch.no_grad():  # as in _generate_and_score_completions, after generation
            ref, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.ref_model,
                ids,
                attention,
                keep,
                batch_size=trainer.args.per_device_train_batch_size,
            )
        for inputs in split_tensor_dict({**x, "ref_per_token_logps": ref}, self.accumulation):
            trainer.training_step(self.model, inputs, inputs["num_items_in_batch"])
        # The optimizer step as Trainer's inner loop takes it.
        grad_norm = trainer._clip_grad_norm(self.model)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        self.model.zero_grad()
        for values in trainer._metrics["train"].values():
            values.clear()  # the metrics Trainer.log would consume
        return float(grad_norm)


class ReferenceStep:
    """A plain PyTorch GRPO step: the floor."""

    name = "reference"

    def __init__(self, batch: Batch, out_dir: Path) -> None:
        self.model = load_model(batch.model_dir)
        self.ref = load_model(batch.model_dir, frozen=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.0)
        self.n = len(batch.rollouts)
        pad = batch.tokenizer.pad_token_id
        self.micro = [
            batch_tensors(batch.rollouts[s], pad, torch.device("cpu"))
            | {"adv": batch.advantages[s]}
            for s in chunks(self.n, batch.micro_batch)
        ]

    def padded_positions(self) -> int:
        return sum(b["input_ids"].numel() for b in self.micro)

    @staticmethod
    def logprobs(model: Any, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probabilities (B, T) of the last T tokens, T the columns of ``loss_mask``.

        Logits only for the T positions that predict them (``logits_to_keep``), as
        ``bat_gym`` computes them: the floor skips the same prompt-only positions.
        """
        t = b["loss_mask"].size(1)
        out = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], logits_to_keep=t + 1
        )
        z = out.logits[:, :-1].float() / TEMPERATURE
        return z.gather(-1, b["input_ids"][:, -t:, None]).squeeze(-1) - z.logsumexp(-1)

    def step(self) -> float:
        with torch.no_grad():
            refs = [self.logprobs(self.ref, b) for b in self.micro]
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        for b, ref in zip(self.micro, refs, strict=True):
            logp = self.logprobs(self.model, b)
            ratio = torch.exp(logp - logp.detach())  # on-policy: old = current
            adv = b["adv"][:, None]
            policy = -torch.min(ratio * adv, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv)
            d = ref - logp
            per_token = (policy + KL_COEF * (d.exp() - d - 1)) * b["loss_mask"]
            per_seq = per_token.sum(-1) / b["loss_mask"].sum(-1).clamp(min=1)
            (per_seq.sum() / self.n).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.opt.step()
        return float(grad_norm)


# ============================================================================ timing


@dataclass
class Timings:
    """Wall and CPU milliseconds of each timed step, and each first step's gradient norm."""

    wall_ms: dict[str, list[float]]
    cpu_ms: dict[str, list[float]]
    first_grad_norm: dict[str, float]


def interleaved(steps: dict[str, Callable[[], float]], repeats: int) -> Timings:
    """Time ``repeats`` steps of each, A, B, C, A, B, C, ...; an untimed round first.

    CPU time is this process's, all threads together: unlike wall time, it does not
    grow while other processes hold the cores, so it is the steadier of the two on a
    shared machine.
    """
    first = {}
    for name, step in steps.items():
        progress(f"warm-up step: {name}")
        first[name] = step()
    out = Timings({name: [] for name in steps}, {name: [] for name in steps}, first)
    for i in range(repeats):
        progress(f"round {i + 1}/{repeats}")
        for name, step in steps.items():
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            out.wall_ms[name].append((time.perf_counter() - wall) * 1e3)
            out.cpu_ms[name].append((time.process_time() - cpu) * 1e3)
    return out


def print_table(t: Timings, padded: dict[str, int], baseline: str, tokens: int) -> None:
    base = statistics.median(t.wall_ms[baseline])
    base_cpu = statistics.median(t.cpu_ms[baseline])
    header = [
        "implementation",
        "median ms/step",
        "min-max ms",
        f"vs {baseline}",
        "tokens/s",
        "CPU ms/step",
        f"CPU vs {baseline}",
        "padded positions",
        "grad norm, step 1",
    ]
    table = [header]
    for name, ms in t.wall_ms.items():
        med, cpu = statistics.median(ms), statistics.median(t.cpu_ms[name])
        table.append(
            [
                name,
                f"{med:,.0f}",
                f"{min(ms):,.0f}-{max(ms):,.0f}",
                f"{med / base:.2f}x",
                f"{tokens / med * 1e3:,.0f}",
                f"{cpu:,.0f}",
                f"{cpu / base_cpu:.2f}x",
                f"{padded[name]:,}",
                f"{t.first_grad_norm[name]:.6f}",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for n, row in enumerate(table):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per implementation")
    parser.add_argument("--groups", type=int, default=8, help="groups per step, B")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per group, G")
    parser.add_argument("--prompt-tokens", type=int, default=600, help="mean prompt length")
    parser.add_argument("--response-tokens", type=int, default=200, help="mean response length")
    parser.add_argument("--micro-batch", type=int, default=8, help="rollouts per forward/backward")
    parser.add_argument("--hidden", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--vocab", type=int, default=1024, help="tokenizer vocabulary size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic rollouts")
    args = parser.parse_args()
    if args.repeats < 1 or args.group_size < 2:
        parser.error(
            f"need --repeats >= 1 and --group-size >= 2, got {args.repeats}, {args.group_size}"
        )

    with tempfile.TemporaryDirectory(prefix="bat_gym_grpo_bench_") as tmp_name:
        tmp = Path(tmp_name)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        progress("building the tiny model")
        model_dir = build_model(tmp / "model", args.vocab, args.hidden, args.layers)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rollouts = make_rollouts(
            args.groups,
            args.group_size,
            args.prompt_tokens,
            args.response_tokens,
            len(tokenizer),
            args.seed,
        )
        rewards = torch.tensor([r.reward for r in rollouts])
        # A_i = r_i - mean_{j in g(i)} r_j  -> (N,)
        adv = group_advantages(rewards, [r.state_id for r in rollouts])
        batch = Batch(model_dir, tokenizer, rollouts, adv, args.micro_batch)

        impls: dict[str, Any] = {}
        skipped = None
        progress("setting up bat_gym, TRL and the reference loop")
        impls["bat_gym"] = BatGymStep(batch, tmp / "bat_gym")
        try:
            impls["trl"] = TRLStep(batch, tmp / "trl")
        except Exception as exc:  # any failure to set TRL up is reported, not fatal
            skipped = f"{type(exc).__name__}: {exc}"
        impls["reference"] = ReferenceStep(batch, tmp / "reference")

        n_params = sum(p.numel() for p in impls["bat_gym"].model.parameters())
        print(
            f"GRPO optimizer step, rollouts excluded: {platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"load average {os.getloadavg()[0]:.1f} at start"
        )
        print(
            f"model: Qwen3-style, {args.layers} layers, hidden {args.hidden}, vocab "
            f"{len(tokenizer)}, {n_params / 1e6:.2f}M parameters, float32, CPU"
        )
        print(
            f"batch: {args.groups} groups x {args.group_size} rollouts, {batch.tokens:,} tokens "
            f"({batch.trained_tokens:,} sampled, loss mask 1), micro-batch {args.micro_batch}; "
            f"temperature {TEMPERATURE}, k3 KL {KL_COEF} with a reference model, clip {CLIP_EPS}, "
            f"seq-mean-token-mean, grad clip {MAX_GRAD_NORM}, AdamW"
        )
        print(f"{args.repeats} timed steps each, interleaved, after one warm-up step each\n")

        timings = interleaved({name: impl.step for name, impl in impls.items()}, args.repeats)
        padded = {name: impl.padded_positions() for name, impl in impls.items()}
        print_table(timings, padded, "trl" if "trl" in impls else "reference", batch.tokens)
        if skipped is not None:
            print(f"\ntrl skipped (ratios are against the reference loop): {skipped}")


if __name__ == "__main__":
    sys.exit(main())
