"""Peak memory of one GRPO update at paper scale: bat_gym's chunked head, whole logits, TRL.

The model has Qwen's vocabulary (151,936 tokens) and Qwen2.5-0.5B's width (hidden 896,
intermediate 4,864, 14 heads, 2 key/value heads, tied embeddings) with few decoder
layers (``--layers``, 1 by default), random weights built on the spot with
transformers' ``Qwen2Config`` (nothing downloaded), float32. At this vocabulary the
output head is most of the memory of an update: whole float32 logits are 4.6 GiB per
8,192-token sequence, and every extra copy of them (scaled by the temperature, their
softmax, their gradient) is as much again.

One micro-batch of ``--micro-batch`` rollouts of ``--seq-len`` tokens each (a 256-token
prompt, then a response of sampled spans, loss mask 1, and tool-observation spans, loss
mask 0), one update: forward, backward and an AdamW step, on-policy (old log-probs are
the current ones, detached), temperature 0.7, clip 0.2, no KL term (no reference model),
sequence-mean then token-mean. The implementations:

* ``bat_gym chunked``: ``bat_gym.trainers.grpo.update.update`` at its defaults:
  ``logprob_chunk_size`` 1024 (the head runs 1024 positions at a time, recomputed in
  backward), ``gradient_checkpointing`` on (AC: each decoder layer recomputed in
  backward), the optimizer ``train`` makes (torch's fused AdamW).
  The decoder's MLPs run 1,024 tokens at a time (``mlp_chunk_size``,
  :mod:`bat_gym.trainers.tiled_mlp`), so a recomputed layer never holds its MLP
  intermediates for the whole micro-batch.
* ``bat_gym chunked, AC on, MLP untiled``: the same with ``mlp_chunk_size=None``.
* ``bat_gym chunked, AC off``: the default with ``gradient_checkpointing=False``.
* ``bat_gym whole``: ``logprob_chunk_size=None``: the (B, T, V) logits (AC on).
* ``trl``: TRL's ``GRPOTrainer`` (loss ``grpo``, ``beta=0``) fed the tensors its
  ``_generate_and_score_completions`` would return, ``training_step`` then the optimizer
  step as ``Trainer`` takes it (clip, step), with TRL's default optimizer
  (``adamw_torch_fused`` with torch >= 2.8). TRL >= 1.x scores through its own fused LM
  head (tiles of 4,096 tokens x 32,768 vocabulary entries). TRL's ``GRPOConfig`` turns
  activation checkpointing on by default (``gradient_checkpointing=True``): ``trl, AC
  on`` is TRL as configured out of the box, ``trl, AC off`` the same without it.

The "vs trl" columns divide each peak by TRL's at the same micro-batch. With one
decoder layer (the default ``--layers 1``) AC has little to drop: the weights, their
gradients, AdamW's moments and the head dominate; with more layers its share grows.

Every configuration runs in a fresh process (same seed, so the same weights and batch),
which reports its peak resident memory (VmHWM; on CUDA ``max_memory_allocated``), its
resident memory before the update (model, batch, trainer set up), the loss and the
gradient norm: the same objective on the same batch gives the same loss and gradient
norm in every implementation. Children take every allocation above 128 KiB straight
from mmap (``MALLOC_MMAP_THRESHOLD_``), so that a freed tensor leaves the resident set at
once and the peak counts live memory. Each child runs under an address-space limit, so a run
that would exhaust the machine fails alone. A whole-logits run predicted not to fit is
not started: its peak is extrapolated (linear in tokens) from two short runs, 1,024 and
2,048 tokens, and shown as "skipped: would need N GiB".

Time on two idle CPU cores: ``--quick`` (2,048 tokens, micro-batch 1) a few minutes;
the defaults (8,192 tokens, micro-batches 1 and 4, five implementations) most of an
hour, most of it the micro-batch-4 runs (``--impl chunked,trl,trl-ac`` for fewer).

Usage: python benchmarks/grpo_memory.py [--quick] [--seq-len T] [--micro-batch 1,4] [--impl ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

GIB = 2**30
PROMPT = 256
TEMPERATURE = 0.7
CLIP_EPS = 0.2
MAX_GRAD_NORM = 1.0
LR = 1e-6
ADVANTAGES = (1.0, -0.5, 0.75, -0.25)  # cycled over the rollouts
IMPLS = ("chunked", "chunked-untiled", "chunked-noac", "whole", "trl", "trl-ac")
NAMES = {
    "chunked": "bat_gym chunked, AC on (default)",
    "chunked-untiled": "bat_gym chunked, AC on, MLP untiled",
    "chunked-noac": "bat_gym chunked, AC off",
    "whole": "bat_gym whole, AC on",
    "trl": "trl, AC off",
    "trl-ac": "trl, AC on (default)",
}
# Each implementation's activation checkpointing (AC) of the decoder layers.
CHECKPOINTING = {
    "chunked": True,
    "chunked-untiled": True,
    "chunked-noac": False,
    "whole": True,
    "trl": False,
    "trl-ac": True,
}
CALIBRATION = (
    1024,
    2048,
)  # tokens per sequence of the two runs a whole-logits peak is extrapolated from


def progress(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Spec:
    """One configuration, as the child process gets it."""

    impl: str
    seq_len: int
    micro_batch: int
    vocab: int
    hidden: int
    layers: int
    chunk_size: int
    device: str
    tokenizer: str
    mlp_chunk_size: int | None = None  # None: GRPOConfig's default


# ============================================================================ child


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmHWM: peak resident, VmRSS: resident now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def build_model(spec: Spec) -> Any:
    """Qwen2.5-0.5B's shape with ``spec``'s vocabulary, width and depth; seeded random weights."""
    from transformers import Qwen2Config

    from bat_gym.trainers.tiny_model import random_init

    heads = max(1, spec.hidden // 64)
    config = Qwen2Config(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.hidden * 4864 // 896,
        num_hidden_layers=spec.layers,
        num_attention_heads=heads,
        num_key_value_heads=2 if heads % 2 == 0 else 1,
        max_position_embeddings=max(32768, spec.seq_len),
        tie_word_embeddings=True,
        rope_theta=1e6,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    return random_init(config, seed=0).to(spec.device)


def make_rollouts(spec: Spec) -> tuple[list[Any], Any]:
    """``micro_batch`` rollouts of exactly ``seq_len`` tokens, and their advantages (N,)."""
    import random

    import torch

    from bat_gym.rollout import EpisodeResult

    rng = random.Random(0)
    out = []
    for i in range(spec.micro_batch):
        prompt = [rng.randrange(3, spec.vocab) for _ in range(PROMPT)]
        ids: list[int] = []
        mask: list[int] = []
        while len(ids) < spec.seq_len - PROMPT:  # sampled turn, observation, sampled turn, ...
            sampled = len(mask) == 0 or mask[-1] == 0
            span = rng.randint(200, 600) if sampled else rng.randint(50, 200)
            ids += [rng.randrange(3, spec.vocab) for _ in range(span)]
            mask += [int(sampled)] * span
        n = spec.seq_len - PROMPT
        out.append(
            EpisodeResult(
                state_id=f"s{i}", prompt_ids=prompt, response_ids=ids[:n],
                response_mask=mask[:n], response_logprobs=None, reward=0.0, verdict=None,
                num_turns=1, num_replies=0, stop_reason="terminated", messages=[],
            )
        )  # fmt: skip
    adv = torch.tensor([ADVANTAGES[i % len(ADVANTAGES)] for i in range(spec.micro_batch)])
    return out, adv


def bat_gym_update(spec: Spec, model: Any, rollouts: list[Any], adv: Any) -> tuple[float, float]:
    """``update`` as ``train`` calls it after the rollouts; returns (loss, grad norm)."""
    import torch

    from bat_gym.trainers.configs import GRPOConfig
    from bat_gym.trainers.fsdp import Dist
    from bat_gym.trainers.grpo.update import make_optimizer, update

    cfg = GRPOConfig(
        model="unused", output_dir="unused", state_ids=("bench",), temperature=TEMPERATURE,
        lr=LR, max_grad_norm=MAX_GRAD_NORM, clip_eps_low=CLIP_EPS, clip_eps_high=CLIP_EPS,
        kl_coef=0.0, micro_batch_size=spec.micro_batch, device=spec.device, bf16="off",
        logprob_chunk_size=None if spec.impl == "whole" else spec.chunk_size,
        gradient_checkpointing=CHECKPOINTING[spec.impl],
        **(
            {"mlp_chunk_size": None}
            if spec.impl == "chunked-untiled"
            else {"mlp_chunk_size": spec.mlp_chunk_size} if spec.mlp_chunk_size else {}
        ),
    )  # fmt: skip
    opt = make_optimizer(model, cfg, torch.device(spec.device))  # as train() makes it
    _SETUP["optimizer"] = "torch AdamW, fused" if opt.defaults.get("fused") else "torch AdamW"
    tokenizer = SimpleNamespace(pad_token_id=0)  # the only thing update asks of it
    mark_setup_done()
    stats = update(
        model, None, opt, rollouts, adv, cfg, torch.device(spec.device), tokenizer,
        nullcontext(), Dist(),
    )  # fmt: skip
    return stats["loss"], stats["grad_norm"]


def trl_update(spec: Spec, model: Any, rollouts: list[Any], adv: Any) -> tuple[float, float]:
    """TRL's ``training_step`` on the prepared batch, then clip and AdamW step."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer
    from trl.trainer.utils import pad

    with tempfile.TemporaryDirectory() as out:
        args = TRLConfig(
            output_dir=out,
            per_device_train_batch_size=2,  # only sizes TRL's data loading, which is bypassed
            gradient_accumulation_steps=1,
            num_generations=2,
            loss_type="grpo",  # per-sequence token mean, then the mean over sequences
            beta=0.0,
            epsilon=CLIP_EPS,
            temperature=TEMPERATURE,
            learning_rate=LR,
            weight_decay=0.0,
            max_grad_norm=MAX_GRAD_NORM,
            # optim: TRL's default (Trainer's: adamw_torch_fused with torch >= 2.8).
            lr_scheduler_type="constant",
            # TRL's GRPOConfig turns it on by default (gradient_checkpointing=True).
            gradient_checkpointing=CHECKPOINTING[spec.impl],
            disable_dropout=True,
            max_completion_length=spec.seq_len,
            use_cpu=spec.device == "cpu",
            bf16=False,
            report_to="none",
            save_strategy="no",
        )
        tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=lambda completions, **_: [0.0] * len(completions),
                args=args,
                train_dataset=Dataset.from_dict({"prompt": ["unused"] * 2}),
                processing_class=tokenizer,
            )
        if CHECKPOINTING[spec.impl]:
            # What Trainer.train() does before its first step (training_step alone does not).
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
            else:  # transformers < 5
                model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs
                )
        trainer._prepare_inputs = lambda inputs: inputs  # the batch arrives scored
        trainer.current_gradient_accumulation_steps = 1
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        _SETUP["optimizer"] = f"{args.optim.value}"
        dev = torch.device(spec.device)
        inputs = {
            "prompt_ids": pad([torch.tensor(r.prompt_ids) for r in rollouts], 0, "left"),
            "prompt_mask": pad([torch.ones(len(r.prompt_ids), dtype=torch.long) for r in rollouts], 0, "left"),
            "completion_ids": pad([torch.tensor(r.response_ids) for r in rollouts], 0, "right"),
            "completion_mask": pad([torch.ones(len(r.response_ids), dtype=torch.long) for r in rollouts], 0, "right"),
            "tool_mask": pad([torch.tensor(r.response_mask) for r in rollouts], 1, "right"),
            "advantages": adv.clone(),
        }  # fmt: skip
        inputs = {k: v.to(dev) for k, v in inputs.items()}
        inputs["num_items_in_batch"] = (inputs["completion_mask"] * inputs["tool_mask"]).sum()
        mark_setup_done()
        loss = trainer.training_step(model, inputs, inputs["num_items_in_batch"])
        grad_norm = trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        return float(loss), float(grad_norm)


_SETUP: dict[str, Any] = {}


def mark_setup_done() -> None:
    """Resident memory with everything set up, just before the update."""
    _SETUP["rss_kib"] = status_kib("VmRSS")
    _SETUP["hwm_kib"] = status_kib("VmHWM")


def child(spec: Spec) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = build_model(spec)
    rollouts, adv = make_rollouts(spec)
    cuda = spec.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    update = trl_update if spec.impl.startswith("trl") else bat_gym_update
    loss, grad_norm = update(spec, model, rollouts, adv)
    result = {
        "loss": loss,
        "grad_norm": grad_norm,
        "seconds": time.perf_counter() - t0,
        "peak_gib": status_kib("VmHWM") / 2**20,
        "setup_gib": _SETUP["rss_kib"] / 2**20,
        "virtual_peak_gib": status_kib("VmPeak") / 2**20,
        "optimizer": _SETUP.get("optimizer", "?"),
        "param_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / GIB,
    }
    if cuda:
        result["cuda_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    return result


# ============================================================================ parent


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / GIB


def run_child(spec: Spec, limit_gib: float) -> dict[str, Any]:
    """One configuration in a fresh process under an address-space limit of ``limit_gib``."""

    def limit() -> None:
        cap = int(limit_gib * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(asdict(spec))],
        capture_output=True,
        text=True,
        preexec_fn=limit if spec.device == "cpu" else None,
        # Allocations above 128 KiB straight from mmap, so that freeing them gives the
        # pages back at once: the resident peak then tracks live tensors, not what the
        # heap kept cached after a free (the same for every implementation).
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "MALLOC_MMAP_THRESHOLD_": "131072"},
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        oom = "memory" in proc.stderr.lower() or proc.returncode in (-9, 137)
        return {"error": f"out of memory under the {limit_gib:.1f} GiB limit" if oom else tail[0]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def whole_logits_estimate(base: Spec, limit_gib: float) -> tuple[float, float] | None:
    """Peak GiB of the whole-logits update as ``a + b * tokens`` from two short runs."""
    peaks = []
    for t in CALIBRATION:
        progress(f"calibration: bat_gym whole, micro-batch 1, {t} tokens")
        r = run_child(
            Spec(**{**asdict(base), "impl": "whole", "seq_len": t, "micro_batch": 1}), limit_gib
        )
        if "error" in r:
            return None
        peaks.append(r["peak_gib"])
    slope = (peaks[1] - peaks[0]) / (CALIBRATION[1] - CALIBRATION[0])
    return peaks[0] - slope * CALIBRATION[0], slope


def gib(x: float) -> str:
    return f"{x:.2f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ["implementation", "micro-batch", "tokens", "peak GiB", "before update GiB",
              "update adds GiB", "vs trl AC off", "vs trl AC on", "loss", "grad norm",
              "seconds", "optimizer"]  # fmt: skip
    refs = [
        {r["micro_batch"]: r["peak_gib"] for r in rows if r["impl"] == t and "peak_gib" in r}
        for t in ("trl", "trl-ac")
    ]
    table, notes = [header], {}
    for r in rows:
        head = [NAMES[r["impl"]], str(r["micro_batch"]), f"{r['tokens']:,}"]
        if "peak_gib" not in r:  # skipped or failed: the note takes the other columns
            notes[len(table)] = r["note"]
            table.append(head + [""] * (len(header) - 3))
            continue
        ratios = [
            f"{r['peak_gib'] / ref[r['micro_batch']]:.2f}x" if r["micro_batch"] in ref else "n/a"
            for ref in refs
        ]
        table.append(
            head
            + [
                gib(r["peak_gib"]),
                gib(r["setup_gib"]),
                gib(r["peak_gib"] - r["setup_gib"]),
                *ratios,
                f"{r['loss']:.6f}",
                f"{r['grad_norm']:.8g}",
                f"{r['seconds']:.0f}",
                r.get("optimizer", "?"),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for n, row in enumerate(table):
        cells = [v.ljust(w) for v, w in zip(row, widths, strict=True)]
        print("  ".join(cells[:3] + [notes[n]] if n in notes else cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def agreement(rows: list[dict[str, Any]]) -> None:
    """Loss and grad norm of each run against TRL's (or bat_gym whole's) on the same batch."""
    print()
    for b in sorted({r["micro_batch"] for r in rows}):
        done = {r["impl"]: r for r in rows if r["micro_batch"] == b and "loss" in r}
        base = next((i for i in ("trl", "trl-ac", "whole") if i in done), None)
        if base is None or len(done) < 2:
            print(f"micro-batch {b}: fewer than two runs finished, nothing to compare")
            continue
        for impl, r in done.items():
            if impl == base:
                continue
            d_loss = abs(r["loss"] - done[base]["loss"])
            d_norm = abs(r["grad_norm"] - done[base]["grad_norm"]) / max(
                done[base]["grad_norm"], 1e-12
            )
            verdict = "agree" if d_loss <= 1e-4 and d_norm <= 1e-4 else "DIFFER"
            print(
                f"micro-batch {b}: {NAMES[impl]} vs {NAMES[base]}: |loss diff| {d_loss:.1e}, "
                f"grad norm relative diff {d_norm:.1e} -> {verdict} (tolerance 1e-4)"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seq-len", type=int, default=8192, help="tokens per sequence (prompt 256)"
    )
    parser.add_argument("--micro-batch", default="1,4", help="comma-separated micro-batch sizes")
    parser.add_argument("--quick", action="store_true", help="2,048 tokens, micro-batch 1")
    parser.add_argument("--impl", default=",".join(IMPLS), help=f"comma-separated, of {IMPLS}")
    parser.add_argument("--chunk-size", type=int, default=1024, help="bat_gym logprob_chunk_size")
    parser.add_argument(
        "--mlp-chunk-size", type=int, help="bat_gym mlp_chunk_size (default: GRPOConfig's)"
    )
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen2/2.5/3)")
    parser.add_argument("--hidden", type=int, default=896, help="model width (Qwen2.5-0.5B: 896)")
    parser.add_argument("--layers", type=int, default=1, help="decoder layers")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda (peak = max_memory_allocated)"
    )
    parser.add_argument(
        "--max-gib", type=float, default=None,
        help="memory a run may use (default: what the machine has available now, less 2 GiB)",
    )  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Spec(**json.loads(args.child)))))
        return 0
    if args.quick:
        args.seq_len, args.micro_batch = 2048, "1"
    batches = [int(b) for b in args.micro_batch.split(",")]
    impls = [i.strip() for i in args.impl.split(",")]
    if any(i not in IMPLS for i in impls) or args.seq_len <= PROMPT or min(batches) < 1:
        parser.error(f"--impl of {IMPLS}, --seq-len > {PROMPT}, micro-batches >= 1")
    budget = args.max_gib if args.max_gib is not None else available_gib() - 2.0
    limit = budget + 2.0  # address space: the resident budget plus the libraries' reservations

    import torch

    from bat_gym.trainers.tiny_model import build_tokenizer

    with tempfile.TemporaryDirectory(prefix="bat_gym_grpo_memory_") as tmp:
        tokenizer_dir = str(
            Path(tmp) / "tokenizer"
        )  # TRL wants one; ids come from the model's range
        build_tokenizer([f"word{i} text{i % 7}" for i in range(200)], tokenizer_dir, vocab_size=300)
        base = Spec("chunked", args.seq_len, batches[0], args.vocab, args.hidden, args.layers,
                    args.chunk_size, args.device, tokenizer_dir, args.mlp_chunk_size)  # fmt: skip
        print(
            f"One GRPO update (forward, backward, AdamW step): {platform.machine()}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__}, device {args.device}; "
            f"memory budget per run {budget:.1f} GiB"
        )
        print(
            f"model: Qwen2 shape, vocab {args.vocab:,}, hidden {args.hidden}, {args.layers} "
            f"layer(s), tied embeddings, float32, random weights; sequences of {args.seq_len:,} "
            f"tokens (prompt {PROMPT}); temperature {TEMPERATURE}, no KL, on-policy; "
            f"bat_gym chunk {args.chunk_size} positions, MLP tile "
            f"{args.mlp_chunk_size or 'the default'} tokens\n"
        )
        estimate = None
        if (
            "whole" in impls
            and args.device == "cpu"
            and max(batches) * args.seq_len > CALIBRATION[1]
        ):
            estimate = whole_logits_estimate(base, limit)
        rows = []
        for b in batches:
            for impl in impls:
                spec = Spec(**{**asdict(base), "impl": impl, "micro_batch": b})
                row: dict[str, Any] = {"impl": impl, "micro_batch": b, "tokens": b * args.seq_len}
                if impl == "whole" and estimate is not None:
                    need = estimate[0] + estimate[1] * b * args.seq_len
                    if need > budget:
                        row["note"] = (
                            f"skipped: would need ~{need:.1f} GiB (> {budget:.1f}; extrapolated "
                            f"from runs at {CALIBRATION[0]:,} and {CALIBRATION[1]:,} tokens)"
                        )
                        rows.append(row)
                        continue
                progress(f"{NAMES[impl]}, micro-batch {b}, {args.seq_len} tokens")
                result = run_child(spec, limit)
                if "error" in result:
                    row["note"] = f"failed: {result['error']}"
                else:
                    row |= result
                    if "cuda_peak_gib" in result:
                        row["peak_gib"], row["setup_gib"] = result["cuda_peak_gib"], 0.0
                rows.append(row)
        print_table(rows)
        params = next((r["param_gib"] for r in rows if "param_gib" in r), None)
        if params is not None:
            print(
                f"\nweights {params:.2f} GiB: weights + gradients + AdamW's two moments = "
                f"{4 * params:.2f} GiB, live at every fp32 AdamW step whatever the "
                "implementation (with the process's own memory, the floor of any peak)"
            )
        agreement(rows)
        peaks = {(r["impl"], r["micro_batch"]): r["peak_gib"] for r in rows if "peak_gib" in r}
        for b in batches:
            for ours, theirs in (("chunked", "trl"), ("chunked", "trl-ac"),
                                 ("chunked-noac", "trl")):  # fmt: skip
                if (ours, b) in peaks and (theirs, b) in peaks:
                    ratio = peaks[ours, b] / peaks[theirs, b]
                    print(
                        f"micro-batch {b}: {NAMES[ours]} peak = {ratio:.2f}x {NAMES[theirs]}'s "
                        "(target <= 0.5x)"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
