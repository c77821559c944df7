import doctest
import math

import pytest

torch = pytest.importorskip("torch")

from bat_gym.trainers import grpo_loss as G  # noqa: E402
from bat_gym.trainers.grpo_loss import (  # noqa: E402
    AGGREGATIONS,
    entropy_from_logits,
    filter_uniform_groups,
    group_advantages,
    grpo_loss,
    kl_k3,
    masked_mean,
    tis_weights,
    token_logprobs,
)

# A 2 x 3 batch: rollout 0 generated 2 tokens (then padding), rollout 1 generated 3;
# token (0, 0) has ratio exp(0.3) > 1.2 with A > 0, so its policy term is clipped.
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
OLD = [[-1.3, -0.4, -2.0], [-0.2, -1.25, -0.9]]
REF = [[-0.9, -0.7, -2.0], [-0.5, -1.0, -0.6]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [1.0, -0.5]


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def hand(logp, old, ref, adv, mask, *, lo=0.2, hi=0.2, beta=0.006, mode, max_len=None):
    """Loss and d loss / d logp with plain floats, token by token."""
    B, T = len(logp), len(logp[0])
    lengths = [sum(row) for row in mask]
    n_tok = sum(lengths)
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        for j in range(T):
            if not mask[i][j]:
                continue
            w = {
                "seq_mean_token_mean": 1 / (B * lengths[i]),
                "token_mean": 1 / n_tok,
                "seq_mean_token_sum_norm": 1 / (B * (max_len or 1)),
            }[mode]
            rho = math.exp(logp[i][j] - old[i][j])
            a = adv[i]
            clipped = min(max(rho, 1 - lo), 1 + hi)
            pg = -min(rho * a, clipped * a)
            # the clipped side carries no gradient
            dpg = 0.0 if clipped * a < rho * a else -a * rho
            d = ref[i][j] - logp[i][j] if ref is not None else 0.0
            k3 = math.exp(d) - d - 1
            dk3 = 1 - math.exp(d)
            loss += w * (pg + beta * k3)
            grad[i][j] = w * (dpg + beta * dk3)
    return loss, grad


# --------------------------------------------------------------------------- advantages


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.2, 0.2, 0.7])
    ids = ["s1", "s1", "s1", "s1", "s2", "s2", "s3"]
    adv = group_advantages(r, ids)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0]))
    # population std of group s1 is 0.5; uniform and singleton groups stay at 0
    adv = group_advantages(r, ids, normalize_std=True, eps=1e-6)
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0]) * 0.5 / (0.5 + 1e-6)
    assert torch.allclose(adv, expected)


def test_group_advantages_with_tensor_ids_and_unequal_groups():
    r = torch.tensor([3, 1, 2, 4, 9])  # integer rewards come back as floats
    ids = torch.tensor([7, 7, 2, 2, 7])  # any integer labels, not contiguous
    adv = group_advantages(r, ids)
    assert adv.dtype == torch.float32
    assert torch.allclose(adv, torch.tensor([3 - 13 / 3, 1 - 13 / 3, -1.0, 1.0, 9 - 13 / 3]))
    std7 = torch.tensor([3.0, 1.0, 9.0]).std(correction=0)
    normed = group_advantages(r, ids, normalize_std=True, eps=0.0)
    assert torch.allclose(normed[[0, 1, 4]], adv[[0, 1, 4]] / std7)
    assert torch.allclose(normed[[2, 3]], torch.tensor([-1.0, 1.0]))
    # per group, advantages sum to zero
    assert abs(float(adv[[0, 1, 4]].sum())) < 1e-5


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="expected 3 group ids"):
        group_advantages(torch.zeros(3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer tensor"):
        group_advantages(torch.zeros(2), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), [0, 1])


def test_filter_uniform_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    keep, share = filter_uniform_groups(r, ["a", "a", "b", "b", "c", "c"])
    assert keep.tolist() == [False, False, True, True, False, False]
    assert share == pytest.approx(2 / 3)
    keep, share = filter_uniform_groups(torch.tensor([0.5, 0.51]), [0, 0], atol=0.02)
    assert keep.tolist() == [False, False] and share == 1.0
    keep, share = filter_uniform_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert keep.numel() == 0 and share == 0.0


# --------------------------------------------------------------------------- k3, logprobs


def test_k3_values_and_gradient():
    logp = t([0.0, -1.0, -2.0, -0.5], grad=True)
    ref = t([0.0, -1.0 + math.log(2), -3.0, 0.5])
    k3 = kl_k3(logp, ref)
    expected = [0.0, 1 - math.log(2), math.exp(-1), math.exp(1) - 2]
    assert torch.allclose(k3, t(expected))
    k3.sum().backward()
    # d k3 / d logp = 1 - exp(ref - logp)
    assert torch.allclose(logp.grad, 1 - torch.exp(ref - logp.detach()))
    # never negative
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    assert (kl_k3(a, b) >= 0).all()


def test_token_logprobs_and_entropy():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([[0, 4, 2], [1, -100, 3]])
    lp = token_logprobs(logits, targets)
    ref = torch.log_softmax(logits, -1)
    for b in range(2):
        for s in range(3):
            want = 0.0 if targets[b, s] < 0 else float(ref[b, s, targets[b, s]])
            assert float(lp[b, s]) == pytest.approx(want, abs=1e-6)
    hot = token_logprobs(logits, targets.clamp(min=0), temperature=0.7)
    assert torch.allclose(hot[0], torch.log_softmax(logits[0] / 0.7, -1)[[0, 1, 2], [0, 4, 2]])
    ent = entropy_from_logits(logits)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-6)
    flat = entropy_from_logits(torch.zeros(1, 1, 8))
    assert float(flat) == pytest.approx(math.log(8))
    assert float(masked_mean(ent, torch.tensor([[1, 0, 0], [0, 0, 0]]))) == pytest.approx(
        float(ent[0, 0])
    )


# --------------------------------------------------------------------------- the loss


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_loss_and_gradient_match_hand_computation(mode):
    max_len = 4 if mode == "seq_mean_token_sum_norm" else None
    logp = t(LOGP, grad=True)
    loss, stats = grpo_loss(
        logp, t(OLD), t(REF), t(ADV), torch.tensor(MASK), aggregation=mode, max_len_norm=max_len
    )
    loss.backward()
    want, want_grad = hand(LOGP, OLD, REF, ADV, MASK, mode=mode, max_len=max_len)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    assert torch.allclose(logp.grad, t(want_grad), rtol=1e-10, atol=1e-14)
    assert logp.grad[0, 2] == 0.0
    assert int(stats["tokens"]) == 5


def test_aggregation_modes_weigh_rollouts_as_documented():
    # per-token losses 1 everywhere, rollout lengths 1 and 3
    per = torch.ones(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    per = torch.where(mask, per, 0.0)
    per[1] *= 3.0  # rollout 1 tokens cost 3
    assert float(AGGREGATIONS["seq_mean_token_mean"](per, mask, None, None)) == 2.0  # (1+3)/2
    assert float(AGGREGATIONS["token_mean"](per, mask, None, None)) == 2.5  # (1+9)/4
    assert float(AGGREGATIONS["seq_mean_token_sum_norm"](per, mask, None, 10)) == 0.5  # (1+9)/10/2
    with pytest.raises(ValueError, match="max_len_norm"):
        AGGREGATIONS["seq_mean_token_sum_norm"](per, mask, None, None)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_micro_batches_with_a_global_normalizer_add_up(mode):
    g = torch.Generator().manual_seed(3)
    logp, old, ref = (torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.1 for _ in "abc")
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    kw = {"aggregation": mode, "max_len_norm": 5}
    full, _ = grpo_loss(logp, old, ref, adv, mask, **kw)
    total = float(mask.sum()) if mode == "token_mean" else 4.0
    parts = [
        grpo_loss(logp[s], old[s], ref[s], adv[s], mask[s], normalizer=total, **kw)[0]
        for s in (slice(0, 1), slice(1, 4))
    ]
    assert float(sum(parts)) == pytest.approx(float(full), rel=1e-12)


def test_masked_tokens_get_exactly_zero_gradient_even_when_garbage():
    logp = torch.tensor(
        [[-1.0, -0.5, float("-inf")], [-0.3, float("nan"), -0.7]], requires_grad=True
    )
    old = torch.tensor([[-1.1, -0.4, 50.0], [-0.2, -1.0, -0.9]])
    ref = torch.tensor([[-0.9, -0.7, float("inf")], [-0.5, 80.0, -0.6]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])  # padding, then an observation token
    for mode in AGGREGATIONS:
        logp.grad = None
        loss, stats = grpo_loss(
            logp, old, ref, torch.tensor(ADV), mask, aggregation=mode, max_len_norm=3
        )
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())
        assert logp.grad[0, 2].item() == 0.0 and logp.grad[1, 1].item() == 0.0
        assert (logp.grad[mask.bool()] != 0).all()


def test_clipping_zeroes_the_gradient_on_the_clipped_side_only():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.5, 0.5
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_(True)
    mask = torch.ones(1, 4)

    def grads(adv):
        logp.grad = None
        loss, stats = grpo_loss(logp, old, None, torch.tensor([adv]), mask)
        loss.backward()
        return logp.grad[0].tolist(), stats

    g, stats = grads(1.0)  # A > 0: high ratios clipped, low ones keep the gradient
    assert g[0] == 0.0 and g[2] == 0.0
    assert g[1] == pytest.approx(-0.5 / 4) and g[3] == pytest.approx(-0.5 / 4)
    assert float(stats["clip_fraction"]) == 0.5 and float(stats["clip_high_fraction"]) == 0.5
    g, stats = grads(-1.0)  # A < 0: low ratios clipped, high ones keep the gradient
    assert g[1] == 0.0 and g[3] == 0.0
    assert g[0] == pytest.approx(1.5 / 4) and g[2] == pytest.approx(1.5 / 4)
    assert float(stats["clip_low_fraction"]) == 0.5
    assert float(stats["ratio_mean"]) == pytest.approx(1.0)
    assert float(stats["ratio_max"]) == pytest.approx(1.5)


def test_asymmetric_clip_band():
    logp = torch.log(torch.tensor([[1.25]])).requires_grad_(True)
    args = (torch.zeros(1, 1), None, torch.tensor([1.0]), torch.ones(1, 1))
    loss, _ = grpo_loss(logp, *args, clip_eps_low=0.2, clip_eps_high=0.28)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-1.25)  # inside the raised upper bound
    logp.grad = None
    loss, _ = grpo_loss(logp, *args, clip_eps_low=0.2, clip_eps_high=0.2)
    loss.backward()
    assert logp.grad.item() == 0.0 and float(loss.detach()) == pytest.approx(-1.2)


def test_kl_term_gradient():
    # A = 0: only the KL term is left; d/dlogp = beta * w * (1 - exp(ref - logp))
    logp = t(LOGP, grad=True)
    loss, stats = grpo_loss(logp, t(OLD), t(REF), t([0.0, 0.0]), torch.tensor(MASK), kl_coef=0.1)
    loss.backward()
    w = t([[1 / 4, 1 / 4, 0.0], [1 / 6, 1 / 6, 1 / 6]])
    assert torch.allclose(logp.grad, 0.1 * w * (1 - torch.exp(t(REF) - t(LOGP))), atol=1e-15)
    k3 = kl_k3(t(LOGP), t(REF))
    assert float(stats["kl"]) == pytest.approx(float(k3[torch.tensor(MASK).bool()].mean()))
    # no reference, or a zero coefficient: no KL term at all
    for ref, beta in ((None, 0.1), (t(REF), 0.0)):
        plain, stats = grpo_loss(
            t(LOGP), t(OLD), ref, t([0.0, 0.0]), torch.tensor(MASK), kl_coef=beta
        )
        assert float(plain) == 0.0


def test_gradcheck_inside_the_band():
    logp = t(LOGP, grad=True)

    def f(x):
        return grpo_loss(x, t(OLD), t(REF), t(ADV), torch.tensor(MASK), clip_eps_high=0.5)[0]

    assert torch.autograd.gradcheck(f, (logp,))


def test_shape_and_argument_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="share one"):
        grpo_loss(x, torch.zeros(2, 2), None, torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, None, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(x, x, None, torch.zeros(2), torch.ones(2, 3), aggregation="sum")
    with pytest.raises(ValueError, match="clip"):
        grpo_loss(x, x, None, torch.zeros(2), torch.ones(2, 3), clip_eps_low=1.0)


def test_doctests():
    assert doctest.testmod(G, raise_on_error=True).failed == 0


# --------------------------------------------------------------------------- TIS, k3 clamp


def test_tis_weights_by_hand():
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]])
    sampler = torch.tensor([[-1.2, -0.5, -0.1], [-2.0, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = tis_weights(old, sampler, mask, cap=2.0)
    # exp(0.2), exp(0), exp(-1.9); exp(1.7) > 2 -> 2, exp(-0.2); masked -> 1
    want = [[math.exp(0.2), 1.0, math.exp(-1.9)], [2.0, math.exp(-0.2), 1.0]]
    torch.testing.assert_close(w, torch.tensor(want), atol=1e-6, rtol=1e-6)
    # No gradient, however the inputs were made.
    assert not tis_weights(old.requires_grad_(), sampler, mask, cap=2.0).requires_grad
    # A huge gap is truncated, never inf.
    assert float(tis_weights(t([[50.0]]), t([[-50.0]]), torch.ones(1, 1), cap=3.0)) == 3.0
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, sampler, mask, cap=0.0)
    with pytest.raises(ValueError, match="share one"):
        tis_weights(old, sampler[:, :2], mask, cap=2.0)


def test_is_weights_scale_the_policy_term_only():
    w = [[0.5, 2.0, 1.0], [1.0, 1.5, 0.25]]
    logp = t(LOGP, grad=True)
    loss, stats = grpo_loss(
        logp, t(OLD), t(REF), t(ADV), torch.tensor(MASK), kl_coef=0.1, is_weights=t(w)
    )
    loss.backward()
    # By hand: each token's policy loss and its gradient times w, the KL part as it was.
    B, T = 2, 3
    lengths = [sum(r) for r in MASK]
    want, want_grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        for j in range(T):
            if not MASK[i][j]:
                continue
            scale = 1 / (B * lengths[i])
            rho, a = math.exp(LOGP[i][j] - OLD[i][j]), ADV[i]
            clipped = min(max(rho, 0.8), 1.2)
            pg, dpg = -min(rho * a, clipped * a), (0.0 if clipped * a < rho * a else -a * rho)
            d = REF[i][j] - LOGP[i][j]
            want += scale * (w[i][j] * pg + 0.1 * (math.exp(d) - d - 1))
            want_grad[i][j] = scale * (w[i][j] * dpg + 0.1 * (1 - math.exp(d)))
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    assert torch.allclose(logp.grad, t(want_grad), rtol=1e-10, atol=1e-14)
    assert float(stats["is_weight_mean"]) == pytest.approx((0.5 + 2 + 1 + 1.5 + 0.25) / 5)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_no_is_weights_and_no_clamp_is_exactly_the_plain_loss(mode):
    kw = {"aggregation": mode, "max_len_norm": 4}
    args = (t(OLD), t(REF), t(ADV), torch.tensor(MASK))
    plain_logp, off_logp, ones_logp = (t(LOGP, grad=True) for _ in range(3))
    plain, plain_stats = grpo_loss(plain_logp, *args, **kw)
    off, off_stats = grpo_loss(off_logp, *args, is_weights=None, kl_clamp=None, **kw)
    ones, _ = grpo_loss(ones_logp, *args, is_weights=torch.ones(2, 3, dtype=torch.float64), **kw)
    for x in (plain, off, ones):
        x.backward()
    assert float(off.detach()) == float(plain.detach()) == float(ones.detach())
    assert torch.equal(off_logp.grad, plain_logp.grad)
    assert torch.equal(ones_logp.grad, plain_logp.grad)
    assert off_stats.keys() == plain_stats.keys()  # no is_weight_mean without weights
    # and the hand computation of the plain objective still holds
    want, _ = hand(LOGP, OLD, REF, ADV, MASK, mode=mode, max_len=4)
    assert float(plain.detach()) == pytest.approx(want, rel=1e-12)


def test_kl_clamp_bounds_each_tokens_k3():
    # A = 0: the loss is beta * mean(k3); k3 values here: 0, ~0.307, e^-1, e - 2
    logp = t([[0.0, -1.0, -2.0, -0.5]], grad=True)
    ref = t([[0.0, -1.0 + math.log(2), -3.0, 0.5]])
    k3 = kl_k3(logp.detach(), ref)
    mask = torch.ones(1, 4)
    loss, stats = grpo_loss(logp, logp.detach(), ref, t([0.0]), mask, kl_coef=1.0, kl_clamp=0.35)
    loss.backward()
    clamped = k3.clamp(max=0.35)
    assert float(loss.detach()) == pytest.approx(float(clamped.mean()), rel=1e-12)
    assert float(stats["kl"]) == pytest.approx(float(clamped.mean()), rel=1e-12)
    # The tokens above the clamp (e^-1 and e - 2) get no KL gradient; the others theirs.
    grad = logp.grad[0]
    assert grad[2] == 0.0 and grad[3] == 0.0
    d = ref[0, 1] - logp.detach()[0, 1]
    assert float(grad[1]) == pytest.approx(float(1 - torch.exp(d)) / 4)
    with pytest.raises(ValueError, match="kl_clamp"):
        grpo_loss(logp, logp, ref, t([0.0]), mask, kl_clamp=0.0)
    with pytest.raises(ValueError, match="is_weights"):
        grpo_loss(logp, logp, ref, t([0.0]), mask, is_weights=torch.ones(1, 3))
