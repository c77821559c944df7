"""The trainer's log-probs through the chunked output head, on tensors and tiny models.

On hand-built tensors the chunked head gives the log-probs, entropies and gradients of
the whole (B, T, V) logits. On models the chunked path gives those of the whole-logits
path (tied and untied heads, a bias, a soft cap), falls back to it with a log line for a
head it cannot reproduce, and the update's importance correction (TIS) and gap alarm
act as configured.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.rollout import EpisodeResult  # noqa: E402
from bat_gym.trainers.activation_checkpointing import set_activation_checkpointing  # noqa: E402
from bat_gym.trainers.configs import GRPOConfig  # noqa: E402
from bat_gym.trainers.fsdp import Dist  # noqa: E402
from bat_gym.trainers.grpo import logprobs  # noqa: E402
from bat_gym.trainers.grpo.batch import batch_tensors  # noqa: E402
from bat_gym.trainers.grpo.logprobs import (  # noqa: E402
    batch_logprobs,
    chunked_logprobs_and_entropy,
)
from bat_gym.trainers.grpo.update import make_optimizer, update  # noqa: E402
from bat_gym.trainers.grpo_loss import entropy_from_logits, token_logprobs  # noqa: E402

CPU = torch.device("cpu")
OFF = nullcontext()


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def rollouts(n: int, vocab: int = 500, logprobs: float | None = None) -> list[EpisodeResult]:
    """``n`` rollouts of different lengths, each with a tool reply (mask 0) inside."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = torch.randint(5, vocab, (6 + i,), generator=g).tolist()
        response = torch.randint(5, vocab, (5 + 3 * i,), generator=g).tolist()
        mask = [1] * len(response)
        mask[1:3] = [0, 0]
        lp = None if logprobs is None else [logprobs * m for m in mask]
        out.append(
            EpisodeResult(
                state_id=f"s{i // 2}", prompt_ids=prompt, response_ids=response,
                response_mask=mask, response_logprobs=lp, reward=float(i % 3), verdict=None,
                num_turns=1, num_replies=1, stop_reason="terminated", messages=[],
            )
        )  # fmt: skip
    return out


def scored(model, batch, chunk_size, temperature=0.7):
    """Log-probs, entropies and every parameter's gradient of sum(logp * u * mask)."""
    model.zero_grad(set_to_none=True)
    logp, entropy = batch_logprobs(model, batch, temperature, OFF, chunk_size=chunk_size)
    u = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)
    (logp * u * batch["loss_mask"]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, grads


def assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert got[2].keys() == want[2].keys() and want[2]
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], atol=1e-5, rtol=1e-5, msg=name)


def chunk_sizes(batch):
    n = batch["loss_mask"].numel()  # B * T positions, chunked as one run
    divisor = next(d for d in range(3, n) if n % d == 0)
    other = next(d for d in range(divisor + 1, n) if n % d)
    return [1, divisor, other, n, 4 * n]


def test_the_chunked_head_equals_the_whole_logits_on_a_tied_model(tiny):
    model = load(tiny)
    assert model.config.tie_word_embeddings
    batch = batch_tensors(rollouts(4), 0, CPU)
    assert (batch["loss_mask"] == 0).any()  # prompt, tool-reply and padding positions
    want = scored(model, batch, None)
    for size in chunk_sizes(batch):
        assert_same(scored(model, batch, size), want)
    assert model not in logprobs._WHOLE_LOGITS


def test_an_untied_head_with_a_bias(tiny):
    model = load(tiny)
    vocab, hidden = model.lm_head.weight.shape
    torch.manual_seed(1)
    model.lm_head = torch.nn.Linear(hidden, vocab, bias=True)
    batch = batch_tensors(rollouts(3), 0, CPU)
    want = scored(model, batch, None, temperature=1.3)
    assert "lm_head.bias" in want[2]
    assert_same(scored(model, batch, 5, temperature=1.3), want)
    assert model not in logprobs._WHOLE_LOGITS


def test_a_soft_capped_head():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        final_logit_softcapping=0.5,  # small, so that the cap changes these logits a lot
    )  # fmt: skip
    model = Gemma2ForCausalLM(config).float()
    head = logprobs.chunkable_head(model)
    assert head is not None and head.softcap == 0.5
    batch = batch_tensors(rollouts(3, vocab=97), 0, CPU)
    want = scored(model, batch, None)
    assert_same(scored(model, batch, 4), want)
    assert model not in logprobs._WHOLE_LOGITS


def test_a_head_it_cannot_reproduce_falls_back_to_the_whole_logits(tiny, caplog):
    batch = batch_tensors(rollouts(3), 0, CPU)
    want = scored(load(tiny), batch, None)

    # Logits rescaled after the projection (as some heads do), invisible in the config.
    model = load(tiny)
    model.lm_head.register_forward_hook(lambda _m, _a, out: out * 0.5)
    rescaled = scored(model, batch, None)
    with caplog.at_level(logging.WARNING, logger="bat_gym.trainers.grpo"):
        assert_same(scored(model, batch, 4), rescaled)
    assert model in logprobs._WHOLE_LOGITS
    assert "not the projection" in caplog.text and "whole (B, T, V) logits" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bat_gym.trainers.grpo"):
        scored(model, batch, 4)
    assert caplog.text == ""  # logged once per model

    # A config that declares a logit scale: not chunked, before any forward.
    model = load(tiny)
    model.config.logit_scale = 0.25
    with caplog.at_level(logging.WARNING, logger="bat_gym.trainers.grpo"):
        assert_same(scored(model, batch, 4), want)  # Qwen3 ignores the field
    assert "logit_scale" in caplog.text


def config(tiny, **kw):
    settings = dict(
        model=str(tiny), output_dir="unused", state_ids=("s",), micro_batch_size=2,
        kl_coef=0.0, device="cpu", max_grad_norm=1e9, temperature=0.7,
    )  # fmt: skip
    return GRPOConfig(**(settings | kw))


def sgd_update(tiny, rs, adv, cfg):
    """One ``update`` with SGD from the saved weights: the weights' change and the stats."""
    from transformers import AutoTokenizer

    model = load(tiny)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = update(model, None, opt, rs, adv, cfg, CPU, AutoTokenizer.from_pretrained(tiny), OFF, Dist())  # fmt: skip
    return {k: v.detach() - before[k] for k, v in model.named_parameters()}, stats


def test_an_update_is_the_same_chunked_or_not(tiny):
    rs, adv = rollouts(5), torch.tensor([0.5, -0.5, 1.0, -1.0, 0.25])
    whole, whole_stats = sgd_update(tiny, rs, adv, config(tiny, logprob_chunk_size=None, kl_coef=0.01, updates_per_batch=2))  # fmt: skip
    chunked, stats = sgd_update(tiny, rs, adv, config(tiny, logprob_chunk_size=7, kl_coef=0.01, updates_per_batch=2))  # fmt: skip
    for name in whole:
        torch.testing.assert_close(chunked[name], whole[name], atol=1e-5, rtol=1e-4, msg=name)
    for key in ("loss", "kl", "entropy", "grad_norm", "clip_fraction"):
        assert stats[key] == pytest.approx(whole_stats[key], rel=1e-4, abs=1e-6), key


def test_tis_weights_the_policy_gradient_and_the_gap_raises_the_alarm(tiny, caplog):
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0])
    # Without sampler log-probs: no correction, no gap.
    plain, stats = sgd_update(tiny, rollouts(4), adv, config(tiny))
    assert stats["tis_weight_mean"] == 1.0 and stats["sampler_gap_alarm"] == 0.0

    # A sampler that put every sampled token at log-prob -30: each w = min(exp(old + 30), 2)
    # = 2, so the policy gradient doubles, and the gap far exceeds the alarm threshold.
    far = rollouts(4, logprobs=-30.0)
    with caplog.at_level(logging.WARNING, logger="bat_gym.trainers.grpo"):
        doubled, stats = sgd_update(tiny, far, adv, config(tiny, tis_cap=2.0))
    for name in plain:
        torch.testing.assert_close(doubled[name], 2 * plain[name], atol=1e-6, rtol=1e-4)
    assert stats["tis_weight_mean"] == pytest.approx(2.0)
    assert stats["tis_truncated_fraction"] == pytest.approx(1.0)
    assert stats["sampler_logprob_gap"] > 20 and stats["sampler_gap_alarm"] == 1.0
    assert "sampler_gap_alarm_at" in caplog.text and "TIS" in caplog.text

    # tis_cap=None: the update is the plain one, the alarm still rings; None silences it.
    off, stats = sgd_update(tiny, far, adv, config(tiny, tis_cap=None))
    for name in plain:
        torch.testing.assert_close(off[name], plain[name], atol=0, rtol=0)
    assert stats["sampler_gap_alarm"] == 1.0 and stats["tis_weight_mean"] == 1.0
    _, stats = sgd_update(tiny, far, adv, config(tiny, sampler_gap_alarm_at=None))
    assert stats["sampler_gap_alarm"] == 0.0


def test_config_checks_the_new_fields(tiny):
    for field, bad in (("tis_cap", 0.0), ("kl_clamp", -1.0), ("sampler_gap_alarm_at", 0.0)):
        with pytest.raises(ValueError, match=field):
            config(tiny, **{field: bad})
    with pytest.raises(ValueError, match="logprob_chunk_size"):
        config(tiny, logprob_chunk_size=0)
    defaults = config(tiny)
    assert defaults.logprob_chunk_size == 1024 and defaults.tis_cap == 2.0
    assert defaults.kl_clamp is None and defaults.sampler_gap_alarm_at == 0.1


def layer_calls(model) -> list[bool]:
    """Records each run of the first decoder layer: True when it ran with grad enabled.

    The hook is on the layer's first module: a checkpointed layer's recompute in the
    backward stops once it has what the backward needs, so later modules may not rerun.
    """
    calls: list[bool] = []
    model.model.layers[0].input_layernorm.register_forward_pre_hook(
        lambda *_: calls.append(torch.is_grad_enabled())
    )
    return calls


def checkpointed_update(tiny, rs, adv, cfg, lr=1.0):
    """``sgd_update`` that also counts the first decoder layer's forwards (grad-enabled ones)."""
    from transformers import AutoTokenizer

    model = load(tiny)
    calls = layer_calls(model)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    stats = update(model, None, opt, rs, adv, cfg, CPU, AutoTokenizer.from_pretrained(tiny), OFF, Dist())  # fmt: skip
    delta = {k: v.detach() - before[k] for k, v in model.named_parameters()}
    return delta, stats, model, calls


@pytest.mark.parametrize("chunk", [None, 7])
def test_gradient_checkpointing_gives_the_same_update(tiny, chunk):
    rs, adv = rollouts(5), torch.tensor([0.5, -0.5, 1.0, -1.0, 0.25])
    kw = dict(logprob_chunk_size=chunk, kl_coef=0.01, updates_per_batch=2)
    plain, plain_stats, plain_model, plain_calls = checkpointed_update(
        tiny, rs, adv, config(tiny, gradient_checkpointing=False, **kw)
    )
    ckpt, stats, model, calls = checkpointed_update(
        tiny, rs, adv, config(tiny, gradient_checkpointing=True, **kw)
    )
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)
    for key in ("loss", "kl", "entropy", "grad_norm", "clip_fraction"):
        assert stats[key] == pytest.approx(plain_stats[key], rel=1e-5, abs=1e-7), key
    # It took effect: 3 micro-batches x 2 passes, each layer run once more in the backward
    # to recompute what it did not keep (the no-grad old log-probs aside).
    grad_passes = 3 * 2
    assert plain_calls.count(True) == grad_passes
    assert calls.count(True) == 2 * grad_passes
    assert model.is_activation_checkpointing and not plain_model.is_activation_checkpointing


def test_gradient_checkpointing_leaves_sampling_alone_and_can_be_turned_off(tiny):
    from transformers import AutoTokenizer

    rs, adv = rollouts(2), torch.tensor([0.5, -0.5])
    assert config(tiny).gradient_checkpointing  # the default
    _, _, model, calls = checkpointed_update(tiny, rs, adv, config(tiny), lr=0.0)
    assert model.is_activation_checkpointing
    # Rollouts sample in eval mode without grad: each layer runs once per token, with
    # its KV cache, and samples what the same weights without checkpointing sample.
    model.eval()
    calls.clear()
    ids = torch.tensor([rs[0].prompt_ids])
    got = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert calls == [False] * 4
    torch.testing.assert_close(got, load(tiny).generate(ids, max_new_tokens=4, do_sample=False))
    # The next update with the option off turns it off on the same model.
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    tok = AutoTokenizer.from_pretrained(tiny)
    update(model, None, opt, rs, adv, config(tiny, gradient_checkpointing=False), CPU, tok, OFF, Dist())  # fmt: skip
    assert not model.is_activation_checkpointing


def test_a_model_without_checkpointing_support_is_updated_without_it(tiny, caplog):
    model = load(tiny)
    model.supports_gradient_checkpointing = False  # shadows the class attribute
    with caplog.at_level(logging.WARNING, logger="bat_gym.trainers.activation_checkpointing"):
        set_activation_checkpointing(model, True)
        set_activation_checkpointing(model, True)
    assert not model.is_activation_checkpointing
    assert caplog.text.count("does not support activation checkpointing") == 1


def test_the_optimizer_is_fused_adamw_and_steps_as_the_for_loop_one(tiny):
    torch.manual_seed(0)
    fused_model, loop_model = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    loop_model.load_state_dict(fused_model.state_dict())
    cfg = config(tiny, lr=1e-2, weight_decay=0.1)
    fused = make_optimizer(fused_model, cfg, CPU)
    assert fused.defaults["fused"]
    loop = torch.optim.AdamW(loop_model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    x = torch.randn(32, 16)
    for _ in range(3):
        for model, opt in ((fused_model, fused), (loop_model, loop)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for (name, a), b in zip(fused_model.named_parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_an_update_raises_the_rewarded_rollouts_and_lowers_the_others(tiny):
    # The sign of the whole path (batch tensors, chunked head, checkpointing, tiling,
    # fused AdamW): after a few steps on one batch, every rollout with A > 0 is likelier
    # under the policy and every one with A < 0 less likely.
    from transformers import AutoTokenizer

    model, rs = load(tiny), rollouts(4)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    cfg = config(tiny, lr=1e-3, gradient_checkpointing=True, mlp_chunk_size=8, logprob_chunk_size=5)

    def sequence_logprobs():
        with torch.no_grad():
            b = batch_tensors(rs, 0, CPU, None)
            logp, _ = batch_logprobs(model, b, cfg.temperature, OFF, chunk_size=None)
            return (logp * b["loss_mask"]).sum(-1)

    before = sequence_logprobs()
    opt = make_optimizer(model, cfg, CPU)
    for _ in range(3):
        update(model, None, opt, rs, adv, cfg, CPU, AutoTokenizer.from_pretrained(tiny), OFF, Dist())  # fmt: skip
    change = sequence_logprobs() - before
    assert (change[adv > 0] > 0).all() and (change[adv < 0] < 0).all(), change


# --------------------------------------------------------------------------- chunked head


def whole_head(hidden, weight, targets, bias=None, temperature=1.0, softcap=None):
    """The reference: the whole (B, T, V) logits, then token_logprobs / entropy_from_logits."""
    logits = hidden @ weight.T + (0.0 if bias is None else bias)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return (
        token_logprobs(logits, targets, temperature=temperature),
        entropy_from_logits(logits.detach(), temperature=temperature),
    )


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 10, 1000])  # 2 x 10 tokens: divides or not
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("vocab_slice", [7, 16384])  # softmax sums over 5 slices of V, or 1
def test_chunked_head_equals_the_whole_logits(
    chunk_size, softcap, with_bias, vocab_slice, monkeypatch
):
    monkeypatch.setattr(logprobs, "_VOCAB_SLICE", vocab_slice)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 10, 8, generator=g, requires_grad=True)
    weight = torch.randn(30, 8, generator=g, requires_grad=True)
    bias = torch.randn(30, generator=g, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 30, (2, 10), generator=g)
    targets[0, 7:] = -100  # ignored labels (padding)
    upstream = torch.randn(2, 10, generator=g)  # any weighting of the log-probs
    leaves = [x for x in (hidden, weight, bias) if x is not None]

    def run(fn):
        logp, entropy = fn()
        (logp * upstream).sum().backward()
        grads = [x.grad.clone() for x in leaves]
        for x in leaves:
            x.grad = None
        return logp.detach(), entropy, grads

    kw = {"bias": bias, "temperature": 0.7, "softcap": softcap}
    want = run(lambda: whole_head(hidden, weight, targets, **kw))
    got = run(
        lambda: chunked_logprobs_and_entropy(hidden, weight, targets, chunk_size=chunk_size, **kw)
    )
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (got[0][0, 7:] == 0).all()
    assert not got[1].requires_grad  # the entropy is a metric


def test_chunked_head_gradcheck_and_options():
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(1, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([[0, 5, -100, 2, 3]])

    def f(h, w, b):
        return chunked_logprobs_and_entropy(
            h, w, targets, bias=b, temperature=1.3, chunk_size=2, softcap=3.0
        )[0]

    assert torch.autograd.gradcheck(f, (hidden, weight, bias))
    logp, entropy = chunked_logprobs_and_entropy(hidden, weight, targets, with_entropy=False)
    assert entropy is None and logp.shape == (1, 5)
    for bad, match in (
        ({"chunk_size": 0}, "chunk_size"),
        ({"temperature": 0.0}, "temperature"),
        ({"softcap": 0.0}, "softcap"),
        ({"bias": torch.zeros(5)}, "bias"),
    ):
        with pytest.raises(ValueError, match=match):
            chunked_logprobs_and_entropy(hidden, weight, targets, **bad)
    with pytest.raises(ValueError, match="weight"):
        chunked_logprobs_and_entropy(hidden, weight[:, :3], targets)


def test_chunked_head_under_bf16_autocast_matches_the_whole_bf16_logits():
    # The projection runs in the autocast dtype, as the model's own head would.
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, 6, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (2, 6), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = token_logprobs(torch.nn.functional.linear(hidden, weight), targets)
        got, _ = chunked_logprobs_and_entropy(hidden, weight, targets, chunk_size=5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    want.sum().backward()
    expected = [hidden.grad.clone(), weight.grad.clone()]
    hidden.grad = weight.grad = None
    got.sum().backward()
    # bf16 matmuls in both; the chunked one sums the weight gradient in fp32.
    torch.testing.assert_close(hidden.grad, expected[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(weight.grad, expected[1], atol=2e-2, rtol=2e-2)
