"""The GRPO trainer under torchrun: two CPU ranks (gloo) with an FSDP2-sharded policy.

The GPU path differs only in the backend (NCCL) and device; what these tests pin down
is the distributed logic: an update split over ranks with uneven micro-batch counts
equals the one-process update, and a whole run (rollouts with gathered weights,
updates, checkpoints) finishes and writes a loadable model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.rollout import EpisodeResult  # noqa: E402
from bat_gym.trainers.configs import GRPOConfig  # noqa: E402
from bat_gym.trainers.fsdp import Dist  # noqa: E402
from bat_gym.trainers.grpo.update import update  # noqa: E402

pytestmark = pytest.mark.slow


def rollouts(n: int) -> tuple[list[EpisodeResult], torch.Tensor]:
    """``n`` made-up rollouts of different lengths (observation tokens in the middle)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = torch.randint(5, 500, (6 + i,), generator=g).tolist()
        response = torch.randint(5, 500, (4 + 2 * i,), generator=g).tolist()
        mask = [1] * len(response)
        mask[1:3] = [0, 0]  # a tool reply
        out.append(
            EpisodeResult(
                state_id=f"s{i // 2}", prompt_ids=prompt, response_ids=response,
                response_mask=mask, response_logprobs=None, reward=float(i % 3), verdict=None,
                num_turns=1, num_replies=1, stop_reason="terminated", messages=[],
            )
        )  # fmt: skip
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0, 0.25, -0.25])[:n]
    return out, adv


def config(model: Path, mlp_tile: int | None = None) -> GRPOConfig:
    # kl_coef 0: no reference model; two passes so the old-policy forward runs too.
    return GRPOConfig(
        model=str(model), output_dir="unused", state_ids=("s",), micro_batch_size=2,
        lr=1e-2, kl_coef=0.0, updates_per_batch=2, device="cpu", mlp_chunk_size=mlp_tile,
    )  # fmt: skip


def torchrun(script: str, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(path)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_a_sharded_update_equals_the_one_processupdate(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # One process, all six rollouts.
    model = AutoModelForCausalLM.from_pretrained(tiny)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # SGD: the weights move linearly in the gradient, so float noise stays small (Adam
    # would blow up sign flips of near-zero gradients).
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    rs, adv = rollouts(6)
    stats = update(
        model, None, opt, rs, adv, config(tiny), torch.device("cpu"),
        AutoTokenizer.from_pretrained(tiny), torch.autocast("cpu", enabled=False), Dist(),
    )  # fmt: skip
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert sum(not torch.equal(expected[k], initial[k]) for k in initial) > len(initial) // 2

    # Two ranks: rank 0 gets four rollouts (two micro-batches), rank 1 two (one, and
    # an idle pass to match).
    torchrun(
        f"""
        import torch, json
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from bat_gym.trainers.grpo import logprobs
        from bat_gym.trainers.fsdp import full_state, gathered, init_distributed, shard
        from bat_gym.trainers.grpo.update import update
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_fsdp import config, rollouts

        dist = init_distributed(torch.device("cpu"))
        model = shard(AutoModelForCausalLM.from_pretrained({str(tiny)!r}), dist)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        rs, adv = rollouts(6)
        mine = [0, 1, 2, 3] if dist.rank == 0 else [4, 5]
        with gathered(model, dist):  # as train() does for the rollouts before each update
            pass
        stats = update(
            # MLPs tiled 5 tokens at a time under FSDP; the one-process update is untiled.
            model, None, opt, [rs[i] for i in mine], adv[mine], config({str(tiny)!r}, 5),
            torch.device("cpu"), AutoTokenizer.from_pretrained({str(tiny)!r}),
            torch.autocast("cpu", enabled=False), dist,
        )
        weights, _ = full_state(model, None, dist)
        # The output head ran in chunks (no fallback to whole logits) under FSDP too.
        stats["chunked"] = model not in logprobs._WHOLE_LOGITS
        if dist.rank == 0:
            torch.save(weights, "weights.pt")
            json.dump(stats, open("stats.json", "w"))
        torch.distributed.destroy_process_group()
        """,
        tmp_path,
    )
    sharded = torch.load(tmp_path / "weights.pt")
    assert set(sharded) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(sharded[name], value, atol=1e-5, rtol=1e-4, msg=name)
    # The logged statistics are over both ranks' tokens, as in one process.
    dist_stats = json.loads((tmp_path / "stats.json").read_text())
    assert dist_stats["chunked"]
    for key in ("loss", "entropy", "clip_fraction", "grad_norm"):
        assert dist_stats[key] == pytest.approx(stats[key], rel=1e-4, abs=1e-6), key


def test_a_grpo_run_under_torchrun_trains_and_saves_a_loadable_model(tiny, toy_bank, tmp_path):
    from transformers import AutoModelForCausalLM

    states = tuple(toy_bank.select(focus="S1")[:4])
    torchrun(
        f"""
        import torch
        from bat_gym.trainers.grpo import GRPOConfig, train
        torch.set_num_threads(1)
        cfg = GRPOConfig(
            model={str(tiny)!r}, output_dir="run", benchmark="toy_pipeline",
            bank={str(toy_bank.root)!r}, state_ids={states!r}, steps=2, groups_per_step=2,
            group_size=2, max_new_tokens=12, max_turns=2, num_envs=2, lr=1e-3, save_every=1,
            device="cpu",
        )
        train(cfg)
        torch.distributed.destroy_process_group()
        """,
        tmp_path,
    )
    run = tmp_path / "run"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # Two groups of two per step, one group per rank, counted over both ranks.
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["scored_rollouts"] == 4 for m in lines)
    AutoModelForCausalLM.from_pretrained(run / "final")
    saved = torch.load(
        run / "checkpoints" / "step-00000002" / "trainer_state.pt", weights_only=False
    )
    assert saved["step"] == 2 and saved["optimizer"]["state"]
