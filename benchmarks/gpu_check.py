"""One GRPO run on a GPU, measured: tokens/s, step time, peak memory, sampler/trainer gap.

Run by ``benchmarks/gpu_check.sh`` (which installs bat_gym first and launches this once
as a single process and once under ``torchrun``, the FSDP2 path). Nothing is
downloaded: a small Qwen3-style model (``--hidden`` wide, ``--layers`` deep, its BPE
tokenizer trained on the toy suite's prompts) and a toy_pipeline Stage Bank are built
on the spot, then :func:`bat_gym.trainers.grpo.train` takes ``--steps`` steps with bf16
autocast and the reference settings (G=4, T=0.7, k3 KL 0.006), activation checkpointing
of the decoder in the update (``--no-gradient-checkpointing`` to leave it off), sampling
with vLLM when it is importable (``--generator auto``) and with the trained model
otherwise.

Printed per step, and as one JSON line at the end (``GPU_CHECK {...}``):

* ``tokens_per_s``: sampled response tokens of the step / its rollout seconds;
* ``step_s``: rollout plus update seconds (the first step includes CUDA warm-up);
* ``peak_gib``: ``torch.cuda.max_memory_allocated`` over the run, this rank;
* ``sampler_logprob_gap``: mean |trainer log-prob - sampler log-prob| over sampled
  tokens; bf16 autocast on one side puts it near 1e-2, a gap near 1 means the sampler
  and the trained weights disagree (stale weights, another model).

    python benchmarks/gpu_check.py --out /tmp/gpu-check [--steps 2] [--generator auto]
    torchrun --nproc-per-node 1 benchmarks/gpu_check.py --out /tmp/gpu-check-fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--generator", choices=("auto", "vllm", "transformers"), default="auto")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GRPOConfig.gradient_checkpointing (default on, the trainer's default)",
    )
    p.add_argument(
        "--device", default="cuda", help="cuda; cpu only to try the script itself (tiny sizes)"
    )
    args = p.parse_args()

    import torch

    from bat_gym.bank import build_bank
    from bat_gym.catalog import get_benchmark
    from bat_gym.trainers.grpo import GRPOConfig, train
    from bat_gym.trainers.tiny_model import build_tiny_model

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check is for a GPU machine (--device cpu to try it)")
    rank = int(os.environ.get("RANK", "0"))
    generator = args.generator
    if generator == "auto":
        try:
            import vllm  # noqa: F401

            generator = "vllm"
        except ImportError:
            generator = "transformers"
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    toy = get_benchmark("toy_pipeline")
    bank_dir, model_dir = out / "bank", out / "model"
    if rank == 0:
        t0 = time.perf_counter()
        bank = build_bank(toy, bank_dir, tasks_per_track=2)
        texts = [str(m.get("content") or "") for s in bank.select() for m in bank.get(s).messages]
        build_tiny_model(
            model_dir,
            texts,
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.hidden // 64,  # head size 64, as vLLM's kernels want
        )
        print(f"bank and model built in {time.perf_counter() - t0:.1f} s", flush=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
        torch.distributed.barrier()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    from bat_gym.bank import StageBank

    cfg = GRPOConfig(
        model=str(model_dir),
        output_dir=str(out / f"grpo-{generator}"),
        benchmark="toy_pipeline",
        bank=str(bank_dir),
        state_ids=tuple(StageBank(bank_dir).select(focus="E2E")[:4]),
        steps=args.steps,
        groups_per_step=4,
        group_size=4,
        max_new_tokens=args.max_new_tokens,
        max_turns=4,
        num_envs=16,
        generator=generator,  # type: ignore[arg-type]
        vllm_kwargs={"gpu_memory_utilization": 0.3} if generator == "vllm" else {},
        device=args.device,
        bf16="on" if cuda else "off",
        gradient_checkpointing=args.gradient_checkpointing,
        save_every=args.steps,
    )
    rows = []

    def show(m: dict) -> None:
        tokens = m["response_tokens"] * m["scored_rollouts"]
        row = {
            "step": m["step"],
            "tokens_per_s": tokens / max(m["rollout_s"], 1e-9),
            "step_s": m["rollout_s"] + m["update_s"],
            "rollout_s": m["rollout_s"],
            "update_s": m["update_s"],
            "sampler_logprob_gap": m["sampler_logprob_gap"],
            "reward": m["reward"],
        }
        rows.append(row)
        if rank == 0:
            print("step " + "  ".join(f"{k} {v:.4g}" for k, v in row.items()), flush=True)

    train(cfg, on_step=show)
    summary = {
        "generator": generator,
        "gradient_checkpointing": args.gradient_checkpointing,
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "last": rows[-1],
    }
    if rank == 0:
        print("GPU_CHECK " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
