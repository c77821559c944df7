"""GRPO loss math as pure tensor functions: advantages, KL estimator, clipped objective.

The rollout and optimisation loop lives elsewhere; this module holds only the math it
calls, tensors in and tensors out, so each piece can be checked by hand on tiny inputs.

Shapes: ``N`` rollouts in a batch (``B`` when they are rows of a padded token batch),
``T`` token positions, ``V`` vocabulary entries, ``G`` groups. A group is every rollout
started from the same Stage Bank state (the group key is the ``state_id``).

Per-token objective of rollout ``i`` at token ``t`` (Shao et al. 2024, "DeepSeekMath",
with the clip band of Schulman et al. 2017 and optionally asymmetric bounds as in
Yu et al. 2025, "DAPO")::

    rho_it  = exp(logp_it - old_logp_it)
    w_it    = min(exp(old_logp_it - sampler_logp_it), C)      (1 without sampler log-probs)
    l_it    = -w_it * min(rho_it * A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) * A_i)
              + beta * min(k3(logp_it, ref_logp_it), kl_clamp)

``w`` is the truncated importance weight (TIS) between the policy the trainer scores
and the engine that sampled the tokens (another precision or kernel); ``C`` and the
clamp of k3 are optional, and without them the objective is the plain one.

Every generated token of rollout ``i`` carries the rollout's advantage ``A_i``; prompt,
observation (tool result) and padding tokens have mask 0 and get exactly zero gradient.

Asynchronous (off-policy) rollouts use the decoupled objective of Hilton et al. 2022
("Batch size-invariance for policy optimization"), as in Fu et al. 2025 ("AReaL"). A
token may have been sampled by a *behaviour* policy ``pi_behav`` some versions older than
the weights ``pi_prox`` the trainer holds when the step begins (the *proximal* policy,
``old_logp`` above). The clip keeps the update close to ``pi_prox``, and a truncated
importance weight (Espeholt et al. 2018, "IMPALA": V-trace's ``rho_bar``) moves the
expectation from ``pi_behav`` to ``pi_prox``::

    rho_it  = exp(logp_it - prox_logp_it)                          (PPO ratio, clipped)
    w_it    = min(exp(prox_logp_it - behav_logp_it), C)             (behaviour IS weight)
    l_it    = -w_it * min(rho_it * A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) * A_i)
              + beta * min(k3(logp_it, ref_logp_it), kl_clamp)

which is the objective above with the sampler's log-probs taken as the behaviour
policy's (:func:`behaviour_is_weights`): staleness and engine mismatch are one gap to
the behaviour policy, corrected once. With fresh samples (staleness 0)
``pi_behav = pi_prox`` up to the engine's rounding, ``w = 1``, and the plain objective
is back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

try:
    import torch
    from torch import Tensor
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "bat_gym.trainers.grpo_loss needs torch: pip install 'bat-gym[train]'"
    ) from exc

from bat_gym.trainers.configs import Aggregation  # noqa: E402 - after the torch check

__all__ = [
    "AGGREGATIONS",
    "group_advantages",
    "filter_uniform_groups",
    "kl_k3",
    "token_logprobs",
    "entropy_from_logits",
    "masked_mean",
    "tis_weights",
    "behaviour_is_weights",
    "grpo_loss",
]

GroupIds = Tensor | Sequence[Hashable]


# --------------------------------------------------------------------------- groups


def _group_index(group_ids: GroupIds, n: int, device: torch.device) -> tuple[Tensor, int]:
    """Map group keys to contiguous indices ``0..G-1``.

    Returns:
        ``(index (N,) long, G)``.
    """
    if isinstance(group_ids, Tensor):
        if group_ids.dtype.is_floating_point or group_ids.dim() != 1:
            raise ValueError(
                f"group_ids must be a 1-D integer tensor, got dtype {group_ids.dtype} "
                f"and shape {tuple(group_ids.shape)}"
            )
        _, index = torch.unique(group_ids.to(device), return_inverse=True)
    else:
        # Any hashable key (ints, state_id strings): first-seen order gives the index.
        seen: dict[Hashable, int] = {}
        index = torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], device=device)
    if index.numel() != n:
        raise ValueError(f"expected {n} group ids (one per reward), got {index.numel()}")
    n_groups = int(index.max()) + 1 if n else 0
    return index.long(), n_groups


def group_advantages(
    rewards: Tensor,
    group_ids: GroupIds,
    *,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages: each reward minus the mean reward of its group.

    ``A_i = r_i - mean_{j in g(i)} r_j``, and with ``normalize_std`` divided by
    ``std_{j in g(i)} r_j + eps``. The standard deviation is the population one
    (divisor ``|g|``), so it is defined for a group of one (whose advantage is 0).
    The BaT recipe uses no std normalisation (Liu et al. 2025, "Dr. GRPO", show it
    up-weights groups that are nearly solved or nearly failed).

    Args:
        rewards: (N,) one scalar reward per rollout.
        group_ids: (N,) group of each rollout: an integer tensor of group indices, or a
            sequence of hashable keys (e.g. ``state_id`` strings).
        normalize_std: divide by the group's reward standard deviation.
        eps: added to the standard deviation so uniform groups give 0, not NaN.

    Returns:
        (N,) advantages, in the rewards' floating dtype (float32 for integer rewards).

    Example:
        >>> group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]))
        tensor([ 0.5000, -0.5000,  0.0000,  0.0000])
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    r = rewards if rewards.dtype.is_floating_point else rewards.float()
    index, n_groups = _group_index(group_ids, r.numel(), r.device)
    # n_g = |g|,  mean_g = sum_{j in g} r_j / n_g  -> (G,)
    counts = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, index, torch.ones_like(r)
    )
    mean = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, index, r) / counts
    # A_i = r_i - mean_g(i)  -> (N,)
    adv = r - mean[index]
    if normalize_std:
        # std_g = sqrt(sum_{j in g} (r_j - mean_g)^2 / n_g)  -> (G,)
        var = torch.zeros_like(mean).index_add_(0, index, adv.square()) / counts
        # A_i = (r_i - mean_g(i)) / (std_g(i) + eps)  -> (N,)
        adv = adv / (var.sqrt()[index] + eps)
    return adv


def filter_uniform_groups(
    rewards: Tensor, group_ids: GroupIds, *, atol: float = 0.0
) -> tuple[Tensor, float]:
    """Which rollouts belong to a group with some reward spread, for dynamic sampling.

    A group whose rewards are all equal (``max - min <= atol``) has zero advantage for
    every member, so it adds no policy gradient, only KL; the trainer may drop it and
    log how often that happens.

    Args:
        rewards: (N,) one reward per rollout.
        group_ids: (N,) group of each rollout (as in :func:`group_advantages`).
        atol: largest spread still counted as uniform.

    Returns:
        ``(keep, zero_advantage_share)``: keep is an (N,) bool mask, True for rollouts in
        a group whose rewards differ; the share is the fraction of groups (not rollouts)
        that are uniform, 0.0 for an empty batch.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    index, n_groups = _group_index(group_ids, rewards.numel(), rewards.device)
    if n_groups == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device), 0.0
    r = rewards.float()
    # spread_g = max_{j in g} r_j - min_{j in g} r_j  -> (G,)
    hi = torch.full((n_groups,), -torch.inf, device=r.device).scatter_reduce(0, index, r, "amax")
    lo = torch.full((n_groups,), torch.inf, device=r.device).scatter_reduce(0, index, r, "amin")
    varied = (hi - lo) > atol
    return varied[index], float(1.0 - varied.float().mean())


# --------------------------------------------------------------------------- tokens


def token_logprobs(logits: Tensor, targets: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target token under the logits.

    The caller aligns the two: for a causal LM, ``logits[:, :-1]`` scores
    ``input_ids[:, 1:]``. Use the sampling temperature of the rollouts so that the
    policy's log-probabilities match those of the sampler.

    ``log p(y_t) = z_t[y_t] / tau - logsumexp(z_t / tau)``, computed in float32.

    Args:
        logits: (B, T, V) unnormalised scores.
        targets: (B, T) token ids; negative ids (ignore labels such as -100) give 0.
        temperature: divides the logits (``tau``); 1.0 leaves them as they are.

    Returns:
        (B, T) float32 log-probabilities.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    valid = targets >= 0
    picked = z.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    # log p = z[y] - logsumexp(z)  -> (B, T)
    logp = picked - torch.logsumexp(z, dim=-1)
    return torch.where(valid, logp, torch.zeros_like(logp))


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Entropy of the next-token distribution at each position.

    ``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v * z_t,v`` (with ``z = logits / tau``),
    which equals ``-sum_v p_v log p_v`` without forming ``log p``; computed in float32.

    Args:
        logits: (B, T, V) unnormalised scores.
        temperature: divides the logits first.

    Returns:
        (B, T) entropies in nats.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


# --------------------------------------------------------------------------- masks and weights


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set (0 when none are).

    Args:
        values: (B, T) per-token values.
        mask: (B, T) bool or 0/1.

    Returns:
        A 0-dim tensor.
    """
    m = mask.bool()
    return torch.where(m, values, torch.zeros_like(values)).sum() / m.sum().clamp(min=1)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from log-probabilities of sampled tokens.

    With ``d = ref_logp - logp``: ``k3 = exp(d) - d - 1`` (Schulman 2020, "Approximating
    KL divergence"). Unbiased for samples from ``pi``, never negative, and lower-variance
    than ``-d``. Its gradient in ``logp`` is ``1 - exp(d)``.

    Args:
        logp: (...) log-probabilities under the policy being trained.
        ref_logp: (...) log-probabilities of the same tokens under the reference.

    Returns:
        (...) per-token estimates, same shape as the inputs.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def tis_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float) -> Tensor:
    """Truncated importance weights from the sampling engine to the trainer's behaviour policy.

    The tokens were drawn by the sampler (e.g. a bf16 vLLM engine), whose probabilities
    differ from those the trainer computes for the same weights (``old_logp``: another
    precision or kernel). Weighting each token's policy-gradient term by their ratio,
    truncated from above, corrects for it (Yao et al. 2025, "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training"; TRL's ``token_truncate`` importance
    sampling, verl's TIS)::

        w_t = min(exp(old_logp_t - sampler_logp_t), C)

    The truncation bounds the variance a token the sampler found far less likely than
    the trainer does would add; a ratio below 1 is kept as it is.

    Args:
        old_logp: (B, T) log-probabilities of the sampled tokens under the behaviour
            policy as the trainer computes it (the current ones, detached, on-policy).
        sampler_logp: (B, T) the same tokens' log-probabilities as the sampler reported.
        mask: (B, T) 1 (or True) on generated tokens.
        cap: the truncation ``C`` (> 0).

    Returns:
        (B, T) weights without gradient, 1 where ``mask`` is 0.

    Example:
        >>> tis_weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[-0.1, -2.0]]),
        ...             torch.ones(1, 2), cap=2.0)
        tensor([[1.1052, 2.0000]])
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if sampler_logp.shape != old_logp.shape or mask.shape != old_logp.shape:
        raise ValueError(
            f"old_logp, sampler_logp and mask must share one (B, T) shape, got "
            f"{tuple(old_logp.shape)}, {tuple(sampler_logp.shape)}, {tuple(mask.shape)}"
        )
    m = mask.bool()
    with torch.no_grad():
        # log w = min(old - sampler, log C): clamped before exp, so never inf.
        log_w = (old_logp.detach().float() - sampler_logp.detach().float()).clamp(max=math.log(cap))
        w = torch.exp(torch.where(m, log_w, torch.zeros_like(log_w)))
    return w


def behaviour_is_weights(
    prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, *, cap: float
) -> tuple[Tensor, Tensor]:
    """Truncated importance weights from the behaviour policy to the proximal one, and where they were cut.

    For asynchronous rollouts (see the module doc): ``behav_logp`` is what the sampler
    reported when it drew each token, with weights possibly some versions behind;
    ``prox_logp`` is the trainer's log-prob of the same token at the start of the step::

        w_t = min(pi_prox(y_t) / pi_behav(y_t), C) = exp(min(prox_t - behav_t, log C))
        truncated_t = prox_t - behav_t > log C        (on masked tokens only)

    The weights are the same numbers :func:`tis_weights` gives (one gap, whether from
    staleness or from the engine); this helper also says which tokens the cap hit, for
    the ``tis_truncated_fraction`` metric.

    Args:
        prox_logp: (B, T) log-probs of the sampled tokens under the proximal policy (the
            trainer's weights when the step starts; no gradient is taken).
        behav_logp: (B, T) log-probs of the same tokens under the policy that sampled them.
        mask: (B, T) 1 (or True) on generated tokens.
        cap: the truncation ``C`` (> 0); V-trace's ``rho_bar`` is 1, this trainer's
            default (``tis_cap``) 2.

    Returns:
        ``(w, truncated)``: (B, T) float32 weights without gradient, 1 where ``mask`` is
        0; (B, T) bool, True on masked tokens whose weight the cap lowered.

    Example:
        >>> w, cut = behaviour_is_weights(torch.tensor([[-1.0, -1.0, -1.0]]),
        ...     torch.tensor([[-1.0, -2.0, -0.5]]), torch.ones(1, 3), cap=2.0)
        >>> w
        tensor([[1.0000, 2.0000, 0.6065]])
        >>> cut
        tensor([[False,  True, False]])
    """
    w = tis_weights(prox_logp, behav_logp, mask, cap=cap)
    with torch.no_grad():
        gap = prox_logp.detach().float() - behav_logp.detach().float()
        truncated = (gap > math.log(cap)) & mask.bool()
    return w, truncated


# --------------------------------------------------------------------------- aggregation


def _seq_mean_token_mean(
    per_token: Tensor, mask: Tensor, normalizer: float | None, _: int | None
) -> Tensor:
    # L = (1/B) sum_i (1/|o_i|) sum_t l_it: each rollout weighs the same, whatever its length.
    per_seq = per_token.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (B,)
    return per_seq.sum() / (normalizer if normalizer is not None else per_token.shape[0])


def _token_mean(per_token: Tensor, mask: Tensor, normalizer: float | None, _: int | None) -> Tensor:
    # L = sum_{i,t} l_it / sum_i |o_i|: each token weighs the same (DAPO).
    total = normalizer if normalizer is not None else mask.sum().clamp(min=1)
    return per_token.sum() / total


def _seq_mean_token_sum_norm(
    per_token: Tensor, mask: Tensor, normalizer: float | None, max_len_norm: int | None
) -> Tensor:
    # L = (1/B) sum_i (1/L_max) sum_t l_it: a constant length divisor, no length bias (Dr. GRPO).
    if max_len_norm is None or max_len_norm <= 0:
        raise ValueError(
            f"aggregation 'seq_mean_token_sum_norm' needs max_len_norm > 0 (the constant "
            f"length divisor, e.g. the generation budget in tokens), got {max_len_norm}"
        )
    per_seq = per_token.sum(dim=-1) / max_len_norm  # (B,)
    return per_seq.sum() / (normalizer if normalizer is not None else per_token.shape[0])


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, float | None, int | None], Tensor]] = {
    "seq_mean_token_mean": _seq_mean_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}
"""Aggregation name -> ``fn(per_token (B,T) zero where masked, mask (B,T) bool,
normalizer, max_len_norm) -> scalar``. A sequence without masked tokens adds 0 but still
counts in the ``B`` of the sequence-level modes."""


# --------------------------------------------------------------------------- loss


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    kl_coef: float = 0.006,
    aggregation: Aggregation = "seq_mean_token_mean",
    max_len_norm: int | None = None,
    normalizer: float | None = None,
    is_weights: Tensor | None = None,
    kl_clamp: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped GRPO objective with a k3 KL penalty, as a loss to minimise.

    Per token (see the module docstring)::

        rho = exp(logp - old_logp)
        l   = -w * min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)
              + kl_coef * min(k3, kl_clamp)

    with ``w`` the importance weights (1 when ``is_weights`` is None) and no clamp when
    ``kl_clamp`` is None; with both at their defaults this is the plain objective.

    then aggregated over the masked tokens by ``aggregation``. Positions with mask 0
    are replaced by constants before any arithmetic, so their gradient is exactly zero
    even when their log-probabilities are garbage (padding) or extreme.

    Args:
        logp: (B, T) log-probabilities of the sampled tokens under the current policy
            (with gradient).
        old_logp: (B, T) the same under the policy that sampled them (no gradient).
        ref_logp: (B, T) the same under the frozen reference, or ``None`` for no KL term.
        advantages: (B,) one advantage per rollout, broadcast to all its tokens.
        mask: (B, T) 1 (or True) on generated tokens, 0 on prompt, observation and
            padding tokens.
        clip_eps_low: lower clip width, ``rho >= 1 - clip_eps_low``.
        clip_eps_high: upper clip width, ``rho <= 1 + clip_eps_high`` (DAPO raises it,
            e.g. 0.28, to keep exploring low-probability tokens).
        kl_coef: weight ``beta`` of the k3 term (BaT: 0.006); 0 drops the term.
        aggregation: one of :data:`AGGREGATIONS` (BaT: sequence-mean then token-mean).
        max_len_norm: the constant length divisor of ``seq_mean_token_sum_norm``.
        normalizer: the outer denominator when this call sees one micro-batch of a
            larger accumulated batch: the total number of rollouts across it (sequence
            modes) or of masked tokens (``token_mean``). ``None`` uses this batch's.
        is_weights: (B, T) per-token weights of the policy-gradient term, e.g. the
            sampler-mismatch correction of :func:`tis_weights`; treated as constants.
            ``None``: no weighting.
        kl_clamp: upper bound of each token's k3 value (> 0), so that a few tokens the
            reference finds very unlikely cannot dominate the penalty; a clamped token
            gets no KL gradient. ``None``: no clamp.

    Returns:
        ``(loss, stats)``: loss is a 0-dim tensor; stats are detached 0-dim tensors
        (token means over masked tokens): ``policy_loss``, ``kl`` (k3 after the clamp;
        0 without a reference), ``ratio_mean``, ``ratio_max``, ``clip_fraction`` (tokens
        whose gradient the clip removes), ``clip_low_fraction``, ``clip_high_fraction``,
        ``tokens`` (masked token count), and with ``is_weights`` also
        ``is_weight_mean``.
    """
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share one (B, T) shape, got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if ref_logp is not None and ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp must be (B, T) {tuple(logp.shape)}, got {ref_logp.shape}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,) ({logp.shape[0]},), got {advantages.shape}")
    if clip_eps_low < 0 or clip_eps_high < 0 or clip_eps_low >= 1:
        raise ValueError(
            f"clip widths must satisfy 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got "
            f"{clip_eps_low}, {clip_eps_high}"
        )
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)}, got {aggregation!r}")
    if is_weights is not None and is_weights.shape != logp.shape:
        raise ValueError(
            f"is_weights must be (B, T) {tuple(logp.shape)}, got {tuple(is_weights.shape)}"
        )
    if kl_clamp is not None and kl_clamp <= 0:
        raise ValueError(f"kl_clamp must be > 0 (or None), got {kl_clamp}")

    m = mask.bool()
    zero = torch.zeros_like(logp)
    # Neutralise masked positions first: `where` passes them no gradient, and the
    # arithmetic below never sees their (possibly inf or NaN) values.
    logp = torch.where(m, logp, zero)
    old_logp = torch.where(m, old_logp.detach(), zero)
    adv = advantages.detach().to(logp.dtype).unsqueeze(-1)  # (B, 1)

    # rho_it = exp(logp_it - old_logp_it)  -> (B, T)
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    # l^pg_it = -min(rho * A_i, clip(rho) * A_i)  -> (B, T)
    pg = -torch.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        # l^pg_it <- w_it * l^pg_it, w a constant  -> (B, T)
        pg = pg * torch.where(m, is_weights.detach().to(logp.dtype), zero)
    per_token = pg
    if ref_logp is not None and kl_coef != 0.0:
        ref = torch.where(m, ref_logp.detach(), zero)
        kl = kl_k3(logp, ref)
        if kl_clamp is not None:
            # k3_it <- min(k3_it, kl_clamp): k3 >= 0, so this bounds it on both sides.
            kl = kl.clamp(max=kl_clamp)
        # l_it = l^pg_it + beta * k3(logp_it, ref_logp_it)  -> (B, T)
        per_token = pg + kl_coef * kl
    else:
        kl = zero
    per_token = torch.where(m, per_token, zero)
    loss = AGGREGATIONS[aggregation](per_token, m, normalizer, max_len_norm)

    with torch.no_grad():
        # The clip removes the gradient where the clipped term is the smaller one:
        # rho > 1 + eps_high with A > 0, or rho < 1 - eps_low with A < 0.
        high = (ratio > 1.0 + clip_eps_high) & (adv > 0) & m
        low = (ratio < 1.0 - clip_eps_low) & (adv < 0) & m
        n_tok = m.sum()
        denom = n_tok.clamp(min=1).to(logp.dtype)
        stats = {
            "policy_loss": AGGREGATIONS[aggregation](
                torch.where(m, pg, zero), m, normalizer, max_len_norm
            ).detach(),
            "kl": masked_mean(kl, m).detach(),
            "ratio_mean": masked_mean(ratio, m).detach(),
            # ratio > 0, so the max over masked tokens ignores the zeros (0 when none).
            "ratio_max": torch.where(m, ratio, zero).amax() if m.any() else zero.sum(),
            "clip_fraction": (high | low).sum() / denom,
            "clip_low_fraction": low.sum() / denom,
            "clip_high_fraction": high.sum() / denom,
            "tokens": n_tok,
        }
        if is_weights is not None:
            stats["is_weight_mean"] = masked_mean(is_weights.detach().to(logp.dtype), m)
    return loss, stats
