"""Asynchronous GRPO: bounded staleness, per-token versions, the behaviour IS weights, resume.

Real parts throughout: a tiny Qwen3-style model sampling through TransformersPolicy, the
toy benchmark's envs, the trainer's own update.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.core.errors import ConfigError  # noqa: E402
from bat_gym.rollout import EpisodeResult  # noqa: E402
from bat_gym.trainers.async_rollouts import (  # noqa: E402
    AsyncRollouts,
    VersionedGenerator,
    VersionedRollout,
    VersionedWorkers,
    fresh_groups,
    token_versions,
)
from bat_gym.trainers.grpo import FixedStates, GRPOConfig, loop, train  # noqa: E402
from bat_gym.trainers.grpo.batch import batch_tensors  # noqa: E402
from bat_gym.trainers.grpo.logprobs import batch_logprobs  # noqa: E402
from bat_gym.trainers.grpo_loss import behaviour_is_weights, grpo_loss  # noqa: E402

CPU = torch.device("cpu")


def config(tiny, bank, out, **kw):
    # cut_turn="act": the random model never closes a turn in 12 tokens, and acting on the
    # cut text gives multi-turn episodes (a tool-call error reply, then the next turn).
    settings = dict(
        model=str(tiny), output_dir=str(out), benchmark="toy_pipeline", bank=str(bank.root),
        state_ids=tuple(bank.select(focus="S1")[:3]), steps=2, groups_per_step=2, group_size=2,
        max_new_tokens=12, max_turns=2, num_envs=2, lr=1e-3, save_every=1, seed=0,
        overlong="keep", cut_turn="act",
    )  # fmt: skip
    settings.update(kw)
    return GRPOConfig(**settings)


def policy(tiny):
    from bat_gym.policies.transformers_policy import TransformersPolicy

    return TransformersPolicy(
        tiny, device="cpu", dtype="float32", max_new_tokens=12, max_batch_size=4, seed=0
    )


def workers(cfg, pol, generate=None):
    import gymnasium as gym

    from bat_gym.core.spec import Budgets

    def make_env():
        budgets = Budgets(max_turns=cfg.max_turns)
        return gym.make(
            "bat/E2E-v0", benchmark=cfg.benchmark, states=cfg.bank, backend="local", budgets=budgets
        )

    def load(weights):
        pol.model.load_state_dict(weights)

    gen = VersionedGenerator(
        generate or (lambda p, n: pol.generate_tokens(p, max_new_tokens=n)), load, version=0
    )
    return VersionedWorkers(
        make_env, gen, pol.tokenizer, max_new_tokens=cfg.max_new_tokens, num_envs=cfg.num_envs,
        max_batch_size=cfg.num_envs, stop_token_ids=sorted(pol.stop_token_ids), cut_turn="act",
    )  # fmt: skip


def nudged(model, scale=0.05, seed=1):
    """A copy of the model's weights, each moved by noise: another policy version."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: v.detach() + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
        for k, v in model.state_dict().items()
    }


# ============================================================================ the loss helper


def test_behaviour_is_weights_by_hand_with_truncation():
    prox = torch.tensor([[-1.0, -1.0, -1.0, -0.2]])
    behav = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])  # same, 1 nat less likely, 0.5 more, far
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last is a tool reply: weight 1, not cut
    w, cut = behaviour_is_weights(prox, behav, mask, cap=2.0)
    # w = min(exp(prox - behav), C): exp(0) = 1, exp(1) = 2.718 -> C = 2, exp(-0.5) = 0.6065
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, math.exp(-0.5), 1.0]]))
    assert cut.tolist() == [[False, True, False, False]]
    assert not w.requires_grad

    # In the loss, on-policy w.r.t. the proximal policy (rho = 1, A = 1): the per-token
    # policy-gradient term is -w * rho * A, so the seq-mean-token-mean loss is
    # -(1 + 2 + e^-0.5) / 3 and d loss / d logp_t = -w_t / 3 on the masked tokens.
    logp = prox.clone().requires_grad_(True)
    loss, stats = grpo_loss(logp, prox, None, torch.tensor([1.0]), mask, kl_coef=0.0, is_weights=w)
    assert float(loss.detach()) == pytest.approx(-(1 + 2 + math.exp(-0.5)) / 3)
    loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-1 / 3, -2 / 3, -math.exp(-0.5) / 3, 0.0]])
    )
    assert float(stats["is_weight_mean"]) == pytest.approx((1 + 2 + math.exp(-0.5)) / 3)
    with pytest.raises(ValueError, match="cap"):
        behaviour_is_weights(prox, behav, mask, cap=0.0)


# ============================================================================ staleness


def rollout(versions, mask, state="s"):
    return VersionedRollout(
        EpisodeResult(
            state_id=state, prompt_ids=[1, 2], response_ids=[5] * len(mask),
            response_mask=mask, response_logprobs=[-1.0] * len(mask), reward=0.0, verdict=None,
            num_turns=1, num_replies=0, stop_reason="terminated", messages=[],
        ),
        versions,
    )  # fmt: skip


def test_a_group_with_a_token_older_than_k_versions_is_not_trained_on():
    assert token_versions([(0, 3), (4, 5)], 7) == [3, 3, 3, 3, 5, 5, 5]
    fresh = [rollout([4, 4, 5], [1, 0, 1]), rollout([5, 5], [1, 1])]
    # One member's first turn was sampled at version 2: at version 5, K = 2, it is 3 old.
    spans = [rollout([2, 5, 5], [1, 0, 1]), rollout([5], [1])]
    # A reply (mask 0) stamped with an old version is never trained on: it does not count.
    old_reply = [rollout([1, 5], [0, 1]), rollout([5], [1])]
    assert fresh_groups([fresh, spans, old_reply], version=5, max_staleness=2) == [
        True, False, True,
    ]  # fmt: skip
    assert fresh_groups([spans], version=5, max_staleness=3) == [True]
    assert fresh_groups([fresh], version=5, max_staleness=0) == [False]


def test_the_producer_drops_batches_the_trainer_outran_and_counts_them(tiny, toy_bank, tmp_path):
    cfg = config(tiny, toy_bank, tmp_path, groups_per_step=1, max_turns=1)
    pol = policy(tiny)
    source = AsyncRollouts(
        workers(cfg, pol), FixedStates(cfg.state_ids), groups_per_step=1, group_size=2,
        max_staleness=1, version=0,
    )  # fmt: skip
    source.start()
    try:
        # K = 1: batches 0 and 1 may start at version 0; batch 2 waits for version 1.
        deadline = time.monotonic() + 60
        while source.queued < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert source.queued == 2, "the producer ran past its staleness bound"
        # The trainer is three updates on: both queued batches are too old to train on.
        source.publish(3, nudged(pol.model))
        batch = source.next_batch(3)
        assert batch.dropped_groups == 2 and source.dropped_total == 2
        assert [r.oldest_version for r in batch.rollouts] == [3, 3]
        assert source.workers.generator.loads == 1
    finally:
        source.close()


# ============================================================================ partial rollouts


def test_an_episode_spanning_an_update_keeps_each_tokens_behaviour_logprobs(
    tiny, toy_bank, tmp_path
):
    from transformers import AutoModelForCausalLM

    cfg = config(tiny, toy_bank, tmp_path, num_envs=1)
    pol = policy(tiny)
    v0 = {k: v.detach().clone() for k, v in pol.model.state_dict().items()}
    v1 = nudged(pol.model)
    calls = []

    def generate(prompts, n):
        out = pol.generate_tokens(prompts, max_new_tokens=n)
        calls.append(len(prompts))
        if len(calls) == 1:  # the trainer publishes version 1 between the two turns
            gen.publish(1, v1)
        return out

    w = workers(cfg, pol, generate)
    gen = w.generator
    try:
        got = w.play_one(cfg.state_ids[0])
    finally:
        w.close()
    r = got.rollout
    assert r.num_turns == 2 and len(calls) == 2
    mask = torch.tensor(r.response_mask, dtype=torch.bool)
    versions = torch.tensor(got.token_versions)
    assert set(versions[mask].tolist()) == {0, 1}
    # Turn 1's tokens (version 0) come first, then turn 2's (version 1).
    first_v1 = int((versions == 1).nonzero()[0])
    assert (versions[:first_v1] == 0).all() and (versions[first_v1:] == 1).all()
    # Each token's recorded log-prob is that of the weights that sampled it.
    batch = batch_tensors([r], 0, CPU, [got.token_versions])
    recorded = batch["sample_logprobs"][0]
    for version, weights in ((0, v0), (1, v1)):
        model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        model.load_state_dict(weights)
        scored, _ = batch_logprobs(model.eval(), batch, 0.7, nullcontext(), with_entropy=False)
        on = (batch["version"][0] == version) & batch["loss_mask"][0].bool()
        assert on.sum() > 0
        torch.testing.assert_close(scored[0][on], recorded[on], atol=1e-4, rtol=1e-4)
        other = (batch["version"][0] == 1 - version) & batch["loss_mask"][0].bool()
        assert (scored[0][other] - recorded[other]).abs().max() > 1e-2  # the other version's


# ============================================================================ train


def final_weights(out):
    from safetensors.torch import load_file

    return load_file(str(Path(out) / "final" / "model.safetensors"))


def test_k0_through_the_async_machinery_equals_the_synchronous_trainer(
    tiny, toy_bank, tmp_path, monkeypatch
):
    # Two envs: the episodes' turns reach the sampler in either order, and their seed keys
    # (step, rank, place in the batch) give both runs the same draws all the same.
    # An untrained model earns no reward (zero advantages), so weight decay moves the
    # weights (5% a step): a generator a version behind would sample other tokens.
    kw = dict(steps=3, num_envs=2, max_turns=2, lr=0.05, weight_decay=1.0)
    sync = train(config(tiny, toy_bank, tmp_path / "sync", **kw))["history"]
    monkeypatch.setattr(loop, "_ASYNC_FROM", 0)  # the producer slots and weight copy, lockstep
    lockstep = train(config(tiny, toy_bank, tmp_path / "async", max_staleness=0, **kw))["history"]
    assert all("staleness_mean" in h for h in lockstep) and "staleness_mean" not in sync[0]
    assert all(h["staleness_mean"] == 0 and h["stale_dropped_groups"] == 0 for h in lockstep)
    assert sync[-1]["kl"] > 1e-4  # the weights moved away from the reference
    for a, b in zip(sync, lockstep, strict=True):
        for key in ("reward", "response_tokens", "loss", "kl", "entropy", "grad_norm",
                    "tis_weight_mean", "sampler_logprob_gap"):  # fmt: skip
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    want, got = final_weights(tmp_path / "sync"), final_weights(tmp_path / "async")
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=name)


def test_an_async_run_finishes_checkpoints_and_resumes(tiny, toy_bank, tmp_path):
    cfg = config(tiny, toy_bank, tmp_path, max_staleness=1, steps=2)
    first = train(cfg)
    assert first["steps"] == 2
    for h in first["history"]:
        assert h["staleness_max"] <= 1 and h["stale_dropped_groups"] == 0
        assert 0 <= h["stale_token_fraction"] <= 1 and h["scored_rollouts"] == 4
    state = torch.load(
        tmp_path / "checkpoints" / "step-00000002" / "trainer_state.pt", weights_only=False
    )
    # The producer had drawn ahead; the checkpoint keeps the cursor of the first batch not
    # trained on, so a resumed run plays those states again.
    assert state["sampler"]["cursor"] == 2 * cfg.groups_per_step
    resumed = train(config(tiny, toy_bank, tmp_path, max_staleness=1, steps=3))
    assert resumed["steps"] == 3
    assert [h["step"] for h in resumed["history"]] == [1, 2, 3]
    assert resumed["history"][2]["staleness_max"] <= 1


def test_async_settings_are_checked(tiny, toy_bank, tmp_path):
    with pytest.raises(ConfigError, match="max_staleness must be >= 0"):
        config(tiny, toy_bank, tmp_path, max_staleness=-1)
    with pytest.raises(ConfigError, match="give a tis_cap"):
        config(tiny, toy_bank, tmp_path, max_staleness=2, tis_cap=None)
    assert config(tiny, toy_bank, tmp_path).max_staleness == 0  # synchronous by default


@pytest.mark.slow
def test_an_async_vllm_generator_gets_each_published_version(tiny, toy_bank, tmp_path):
    pytest.importorskip(
        "vllm", reason="vllm is not installed (optional extra: pip install 'bat-gym[vllm]')"
    )
    engine = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.3,
              "max_model_len": 2048}  # fmt: skip
    # Weight decay moves the weights 5% a step whatever the (zero) advantages.
    cfg = config(
        tiny, toy_bank, tmp_path, steps=3, generator="vllm", vllm_kwargs=engine, lr=0.05,
        weight_decay=1.0, max_staleness=1,
    )  # fmt: skip
    history = train(cfg)["history"]
    assert history[-1]["kl"] > 1e-4, history
    # Tokens of the trainer's own version score as vLLM scored them: the engine loaded
    # each published version (older tokens differ by the updates since, and are weighted).
    assert all(h["sampler_logprob_gap"] < 1e-3 for h in history), history
    assert all(h["staleness_max"] <= 1 and h["stale_dropped_groups"] == 0 for h in history)
