"""The GRPO policy update: micro-batched clipped-ratio steps over one batch of rollouts.

:func:`update` runs ``updates_per_batch`` optimizer steps; each accumulates the
gradient of :func:`~bat_gym.trainers.grpo_loss.grpo_loss` micro-batch by micro-batch
(:func:`_accumulate`), and the step's statistics are token means over every rank
(:func:`_update_stats`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from bat_gym.rollout import EpisodeResult
from bat_gym.trainers.activation_checkpointing import set_activation_checkpointing
from bat_gym.trainers.configs import GRPOConfig
from bat_gym.trainers.fsdp import Dist
from bat_gym.trainers.grpo.batch import batch_tensors, chunks, idle_batch, policy_tokens
from bat_gym.trainers.grpo.logprobs import batch_logprobs
from bat_gym.trainers.grpo_loss import behaviour_is_weights, grpo_loss, masked_mean
from bat_gym.trainers.tiled_mlp import set_mlp_tiling

__all__ = ["make_optimizer", "update"]

log = logging.getLogger(__name__)

UPDATE_STATS = (
    "sampler_logprob_gap",
    "sampler_gap_alarm",
    "tis_weight_mean",
    "tis_truncated_fraction",
    "loss",
    "kl",
    "clip_fraction",
    "entropy",
    "grad_norm",
)
# Stats of an update on asynchronous rollouts: mean versions behind per trained token, and
# the share of trained tokens sampled by older weights.
ASYNC_STATS = ("staleness_mean", "stale_token_fraction")
# The config fields grpo_loss takes under the same names.
_LOSS_SETTINGS = ("clip_eps_low", "clip_eps_high", "kl_coef", "aggregation", "kl_clamp")
# What the micro-batches add up over a step: token-weighted sums and their token counts.
_TOTALS = (
    "loss",
    "entropy_sum",
    "kl_sum",
    "clip_fraction_sum",
    "gap_sum",
    "gap_tokens",
    "tokens",
) + ("tis_weight_sum", "tis_truncated_sum", "lag_sum", "stale_sum")


def make_optimizer(model: Any, cfg: GRPOConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the (float32 master) parameters, with torch's fused kernel on CPU and CUDA.

    The fused kernel updates a parameter in one pass; the for-loop one forms
    ``sqrt(v) / bias_correction`` as two temporaries the size of the parameter, which for
    a 151,936 x 896 embedding is 1 GiB on top of the weights, gradients and moments at the
    optimizer step, often the update's peak. Same arithmetic, to float rounding.
    """
    fused = True if device.type in ("cpu", "cuda") else None
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused
    )


def update(
    model: Any,
    ref: Any,
    opt: torch.optim.Optimizer,
    rollouts: Sequence[EpisodeResult],
    adv: torch.Tensor,
    cfg: GRPOConfig,
    device: torch.device,
    tokenizer: Any,
    ctx: Any,
    dist: Dist,
    *,
    versions: Sequence[Sequence[int]] | None = None,
    version: int = 0,
    set_checkpointing: bool = True,
) -> dict[str, float]:
    """``updates_per_batch`` optimizer steps over the rollouts, micro-batch by micro-batch.

    Under FSDP every forward and backward is a collective, so a rank with fewer
    micro-batches than another runs idle passes (zero loss, zero gradient) to match.

    Asynchronous rollouts pass ``versions``, each rollout's per-response-token policy
    versions (:class:`~bat_gym.trainers.async_rollouts.VersionedRollout`), and
    ``version``, the weights' own (optimizer steps so far): the stats then include
    ``staleness_mean`` and ``stale_token_fraction``, and the sampler gap is measured on
    the tokens of the current version only (older ones differ by the updates since,
    which the importance weights correct). ``set_checkpointing`` applies
    ``cfg.gradient_checkpointing`` to the model first; ``train`` sets it once at the
    start and passes False.

    Args:
        model: the trained model (sharded under FSDP).
        ref: the frozen KL reference model, or None.
        opt: the model's optimizer.
        rollouts: the rollouts trained on, (N,).
        adv: their advantages, (N,).
        cfg: the run's settings.
        device: where the batches go.
        tokenizer: gives the pad id.
        ctx: the forward passes' autocast context.
        dist: the ranks (one process: ``Dist()``).
        versions: per rollout, its tokens' policy versions (asynchronous rollouts).
        version: the weights' own version (optimizer steps so far).
        set_checkpointing: apply ``cfg.gradient_checkpointing`` first.

    Returns:
        The step's statistics: :data:`UPDATE_STATS`, and :data:`ASYNC_STATS` with
        ``versions``; all 0 when no rank has a rollout to train on.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = [
        batch_tensors(rollouts[s], pad, device, None if versions is None else versions[s])
        | {"adv": adv[s].to(device)}
        for s in chunks(len(rollouts), cfg.micro_batch_size)
    ]
    # The outer denominator spans the whole accumulated batch (and every rank), so
    # micro-batching does not change the loss: sequences, or masked tokens for token_mean.
    local = float(
        sum(b["loss_mask"].sum() for b in batches)
        if cfg.aggregation == "token_mean"
        else len(rollouts)
    )
    normalizer = float(dist.all_sum(torch.tensor(local, device=device)).item())
    if normalizer == 0:  # no rollout scored on any rank
        return dict.fromkeys(UPDATE_STATS + (ASYNC_STATS if versions is not None else ()), 0.0)
    batches += [idle_batch(pad, device)] * (dist.all_max(len(batches)) - len(batches))
    if set_checkpointing:
        set_activation_checkpointing(model, cfg.gradient_checkpointing)
        set_mlp_tiling(model, cfg.mlp_chunk_size)
    _score_fixed_policies(model, ref, batches, cfg, ctx)
    # seq_mean_token_sum_norm's divisor counts the tokens the policy sampled, not the
    # tool results between its turns: those have mask 0 and no gradient, and counting
    # them would scale the step by how long the longest episode's tool output happened
    # to be (an effective learning rate that moves from step to step).
    longest = max((policy_tokens(r) for r in rollouts), default=1)
    max_len = cfg.max_len_norm or dist.all_max(longest)
    # The sampler's own log-probs (when it reports them) against the trainer's: a gap
    # well above float noise means the sampler and the trained model disagree (another
    # precision or kernel, stale weights). The ratio rho (trainer vs trainer) does not
    # see it; the truncated importance weights (TIS) correct the policy gradient for it.
    sampled_lp = all(r.response_logprobs is not None for r in rollouts)
    tis = cfg.tis_cap is not None and sampled_lp
    model.train()
    totals = dict.fromkeys(_TOTALS, 0.0)
    for step in range(cfg.updates_per_batch):
        opt.zero_grad(set_to_none=True)
        for b in batches:
            _accumulate(
                model, b, cfg, ctx, totals,
                normalizer=normalizer, max_len=max_len, tis=tis,
                gap=step == 0 and sampled_lp, first=step == 0, version=version,
            )  # fmt: skip
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
    return _update_stats(totals, grad_norm, cfg, dist, tis=tis, asynchronous=versions is not None)


def _score_fixed_policies(
    model: Any, ref: Any, batches: list[dict[str, Any]], cfg: GRPOConfig, ctx: Any
) -> None:
    """Each batch's ``old`` (the sampling policy) and ``ref`` (pi_ref) log-probs, (B, T).

    With one pass over the batch the weights do not move before the optimizer step, so
    ``old`` is left None, to be ``logp.detach()`` (rho = 1, the same gradient), and no
    forward is spent on it.
    """
    on_policy = cfg.updates_per_batch == 1
    chunk = cfg.logprob_chunk_size

    def score(m: Any, b: dict[str, Any]) -> torch.Tensor:
        return batch_logprobs(m, b, cfg.temperature, ctx, with_entropy=False, chunk_size=chunk)[0]

    with torch.no_grad():
        for b in batches:
            if b.get("idle"):
                if not on_policy:
                    score(model, b)  # the collective every rank runs
                continue
            b["old"] = None if on_policy else score(model, b)
            b["ref"] = score(ref, b) if ref is not None else None


def _accumulate(
    model: Any,
    b: dict[str, Any],
    cfg: GRPOConfig,
    ctx: Any,
    totals: dict[str, float],
    *,
    normalizer: float,
    max_len: int,
    tis: bool,
    gap: bool,
    first: bool,
    version: int,
) -> None:
    """One micro-batch's forward and backward; its token-weighted stats added to ``totals``.

    ``gap``: measure the sampler's log-prob gap (first pass, sampler log-probs known);
    ``first``: the first pass over the batch, where staleness is measured.
    """
    chunk = cfg.logprob_chunk_size
    if b.get("idle"):
        logp, _ = batch_logprobs(
            model, b, cfg.temperature, ctx, with_entropy=False, chunk_size=chunk
        )
        (logp.sum() * 0.0).backward()
        return
    logp, entropy = batch_logprobs(model, b, cfg.temperature, ctx, chunk_size=chunk)
    # The proximal policy: the weights at the start of this step.
    old = logp.detach() if b["old"] is None else b["old"]
    # w_t = min(exp(old_t - sampler_t), C)  -> (B, T), detached; the sampler is the
    # behaviour policy, whether it differs by engine or, asynchronously, by version.
    is_w, truncated = (
        behaviour_is_weights(old, b["sample_logprobs"], b["loss_mask"], cap=cfg.tis_cap)
        if tis
        else (None, None)
    )
    loss, stats = grpo_loss(
        logp, old, b["ref"], b["adv"], b["loss_mask"],
        max_len_norm=max_len, normalizer=normalizer, is_weights=is_w,
        **{name: getattr(cfg, name) for name in _LOSS_SETTINGS},
    )  # fmt: skip
    loss.backward()
    mask = b["loss_mask"]
    weight = mask.sum().item()
    totals["loss"] += loss.item()
    totals["entropy_sum"] += float(masked_mean(entropy, mask) * weight)
    for k in ("kl", "clip_fraction"):
        if k in stats:
            totals[f"{k}_sum"] += float(stats[k]) * weight
    totals["tokens"] += weight
    if gap:
        diff = (logp.detach() - b["sample_logprobs"]).abs()
        # Asynchronously, only tokens of the current version: the engine's gap.
        fresh = mask * (b["version"] == version) if "version" in b else mask
        n_fresh = fresh.sum().item()
        totals["gap_sum"] += float(masked_mean(diff, fresh) * n_fresh)
        totals["gap_tokens"] += n_fresh
    if first and "version" in b:
        lag = (version - b["version"]).clamp(min=0).float()  # (B, T) versions behind
        totals["lag_sum"] += float(masked_mean(lag, mask) * weight)
        totals["stale_sum"] += float(masked_mean((lag > 0).float(), mask) * weight)
    if is_w is not None:
        totals["tis_weight_sum"] += float(stats["is_weight_mean"]) * weight
        totals["tis_truncated_sum"] += float(masked_mean(truncated.float(), mask) * weight)


def _update_stats(
    totals: dict[str, float],
    grad_norm: Any,
    cfg: GRPOConfig,
    dist: Dist,
    *,
    tis: bool,
    asynchronous: bool,
) -> dict[str, float]:
    """The step's statistics from every rank's sums: token means over the updates."""
    # Sums over every rank's tokens (the loss is already a share of the global mean).
    keys = sorted(totals)
    summed = dist.all_sum(torch.tensor([totals[k] for k in keys], dtype=torch.float64))
    totals = dict(zip(keys, summed.tolist(), strict=True))
    tokens = max(totals["tokens"], 1.0)
    n = cfg.updates_per_batch
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
        grad_norm = grad_norm.full_tensor()
    gap = totals["gap_sum"] / max(totals["gap_tokens"], 1.0)
    alarm = cfg.sampler_gap_alarm_at is not None and gap > cfg.sampler_gap_alarm_at
    if alarm and dist.rank == 0:
        log.warning(
            "sampler_logprob_gap %.4g nats/token > sampler_gap_alarm_at %g: the sampler's "
            "log-probs of its own tokens differ from the trainer's by more than float noise "
            "(stale sampler weights, another temperature or model?); %s",
            gap,
            cfg.sampler_gap_alarm_at,
            f"TIS (tis_cap={cfg.tis_cap}) corrects the policy gradient in part"
            if tis
            else "no importance correction is applied (tis_cap=None)",
        )
    staleness = (
        {
            "staleness_mean": totals["lag_sum"] / (tokens / n),
            "stale_token_fraction": totals["stale_sum"] / (tokens / n),
        }
        if asynchronous
        else {}
    )
    return staleness | {
        "sampler_logprob_gap": gap,
        "sampler_gap_alarm": float(alarm),
        # Token means over updates (1 and 0 when TIS was not applied).
        "tis_weight_mean": totals["tis_weight_sum"] / tokens if tis else 1.0,
        "tis_truncated_fraction": totals["tis_truncated_sum"] / tokens,
        "loss": totals["loss"] / n,
        "kl": totals["kl_sum"] / tokens,
        "clip_fraction": totals["clip_fraction_sum"] / tokens,
        "entropy": totals["entropy_sum"] / tokens,
        "grad_norm": float(grad_norm),
    }
