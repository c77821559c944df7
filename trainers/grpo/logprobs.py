"""Log-probabilities of a batch's own tokens under a model: the whole chunked output head.

:func:`batch_logprobs` scores the T response positions of a token batch
(:func:`~bat_gym.trainers.grpo.batch.batch_tensors`). With a chunk size it takes the
model apart at its output head (:func:`chunkable_head`) and runs the head
``chunk_size`` positions at a time (:func:`chunked_logprobs_and_entropy`, a custom
autograd function that recomputes each chunk's logits in the backward), so the
(B, T, V) logits are never formed; models whose head does not fit fall back to the
whole logits, with a log line.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from bat_gym.trainers.grpo.batch import chunks
from bat_gym.trainers.grpo_loss import entropy_from_logits, token_logprobs

__all__ = ["batch_logprobs", "chunkable_head", "chunked_logprobs_and_entropy"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the chunked head


# Vocabulary entries per slice of a chunk's softmax sums: c x 16,384 floats of scratch
# (64 MiB at c = 1024) next to the chunk's (c, V) logits.
_VOCAB_SLICE = 16384


class _ChunkedHead(torch.autograd.Function):
    """Log-probs (and entropies) of ``hidden @ weight.T + bias``, one chunk of tokens at a time.

    Forward keeps one float per token (``logsumexp``); backward recomputes each chunk's
    logits and turns them, in place, into that chunk's logits gradient. So at most one
    (chunk, V) block is alive at a time (two in a soft-capped backward), in the forward
    and in the backward, instead of the (N, V) logits and their gradient.
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx: Any,
        hidden: Tensor,  # (N, H)
        weight: Tensor,  # (V, H)
        bias: Tensor | None,  # (V,)
        targets: Tensor,  # (N,)
        temperature: float,
        chunk_size: int,
        softcap: float | None,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        # The entropy is a metric: no gradient, and none materialised for it in backward.
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        # float32 at least, whatever the projection's dtype (float64 stays float64).
        fp = torch.promote_types(hidden.dtype, torch.float32)
        logp = torch.empty(n, dtype=fp, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else None
        valid = targets >= 0
        y = targets.clamp(min=0).unsqueeze(-1)  # (N, 1)
        compute_dtype = hidden.dtype
        for c in chunks(n, chunk_size):
            # Under autocast the projection runs in the autocast dtype, as the model's head would.
            logits = F.linear(hidden[c], weight, bias)  # (c, V)
            compute_dtype = logits.dtype
            z = _scale_logits(logits.to(fp), temperature, softcap)  # (c, V) fp32
            del logits  # a bf16 block, once z holds its float32 copy
            picked = z.gather(-1, y[c]).squeeze(-1)  # (c,) z_t[y_t]
            # logsumexp_t = m_t + log sum_v exp(z_tv - m_t), m_t = max_v z_tv; the sums run
            # over slices of the vocabulary, so exp(z - m) never needs a second (c, V) block.
            m = z.amax(dim=-1, keepdim=True)  # (c, 1)
            s = torch.zeros_like(picked)  # (c,) sum_v e_tv, e_tv = exp(z_tv - m_t)
            dot = torch.zeros_like(picked)  # (c,) sum_v e_tv z_tv
            for v in chunks(z.shape[-1], _VOCAB_SLICE):
                e = torch.sub(z[:, v], m).exp_()  # (c, slice)
                s += e.sum(dim=-1)
                if entropy is not None:
                    dot += e.mul_(z[:, v]).sum(dim=-1)
                del e
            lse[c] = m.squeeze(-1) + s.log()
            # log p(y_t) = z_t[y_t] - logsumexp_t
            logp[c] = picked - lse[c]
            if entropy is not None:
                # H_t = logsumexp_t - sum_v p_tv z_tv, p_tv = e_tv / s_t
                entropy[c] = lse[c] - dot / s
            # Free this chunk's block before the next projection allocates its own.
            del z
        logp = torch.where(valid, logp, torch.zeros_like(logp))
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk_size, ctx.softcap = temperature, chunk_size, softcap
        ctx.compute_dtype = compute_dtype
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor | None, _grad_entropy: Tensor | None) -> tuple:  # noqa: D102
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_logp is None or not (need_h or need_w or need_b):
            return (None,) * 8
        tau, cap, cd = ctx.temperature, ctx.softcap, ctx.compute_dtype
        # Ignored targets got a constant 0: no gradient from them.
        g = torch.where(targets >= 0, grad_logp.to(lse.dtype), torch.zeros_like(lse)).unsqueeze(-1)
        y = targets.clamp(min=0).unsqueeze(-1)  # (N, 1)
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulated in fp32 (at least) across chunks, whatever the compute dtype: a bf16
        # sum of the chunks' products would round every chunk's share.
        acc = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        # Backward runs outside the caller's autocast: cast by hand to the forward's dtype.
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cd)
            b = None if bias is None else bias.to(cd)
            for c in chunks(hidden.shape[0], ctx.chunk_size):
                h = hidden[c].to(cd)  # (c, H)
                raw = F.linear(h, w, b).to(lse.dtype)  # (c, V)
                if cap is not None:
                    # z = cap * tanh(l / cap) / tau  ->  dz/dl = (1 - tanh^2) / tau
                    t = raw.div_(cap).tanh_()
                    z = t * cap
                    if tau != 1.0:
                        z.div_(tau)
                else:
                    t, z = None, raw.div_(tau) if tau != 1.0 else raw
                # d log p(y_t) / d z_tv = 1[v = y_t] - p_tv, p_tv = exp(z_tv - logsumexp_t)
                grad_z = z.sub_(lse[c].unsqueeze(-1)).exp_().mul_(-g[c])
                grad_z.scatter_add_(-1, y[c], g[c])
                if tau != 1.0:
                    grad_z.div_(tau)
                if t is not None:
                    grad_z.mul_(t.mul_(t).neg_().add_(1.0))
                gl = grad_z.to(cd)  # (c, V)
                if grad_h is not None:
                    grad_h[c] = (gl @ w).to(hidden.dtype)  # (c, H)
                if grad_w is not None:
                    if gl.dtype == acc:
                        grad_w.addmm_(gl.t(), h)  # (V, H), in place
                    else:
                        grad_w += (gl.t() @ h).to(acc)
                if grad_b is not None:
                    grad_b += grad_z.sum(dim=0).to(acc)
                del raw, t, z, grad_z, gl  # before the next chunk's projection
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def _scale_logits(z: Tensor, temperature: float, softcap: float | None) -> Tensor:
    """``cap * tanh(z / cap) / tau`` (the cap only when given), in place on ``z``."""
    if softcap is not None:
        z = z.div_(softcap).tanh_().mul_(softcap)
    if temperature != 1.0:
        z = z.div_(temperature)
    return z


def chunked_logprobs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    softcap: float | None = None,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Token log-probs and entropies of the output projection, in chunks.

    The same as :func:`~bat_gym.trainers.grpo_loss.token_logprobs` and
    :func:`~bat_gym.trainers.grpo_loss.entropy_from_logits` of the whole logits.

    With ``l = hidden @ weight.T + bias`` the logits (never formed whole) and
    ``z = cap * tanh(l / cap) / tau`` (the soft cap of Gemma-2-style heads, when given)::

        log p(y_t) = z_t[y_t] - logsumexp(z_t)
        H_t        = logsumexp(z_t) - sum_v softmax(z_t)_v * z_t,v

    ``B * T`` token positions are taken ``chunk_size`` at a time, in the forward and
    again in the backward, which recomputes each chunk's logits instead of storing them:
    the memory for the head is ``O(chunk_size * V)`` instead of ``O(B * T * V)``, for
    one more projection (matmul) in the backward. The results equal those of the whole
    logits (to float rounding), whatever ``chunk_size``.

    Args:
        hidden: (B, T, H) the model's last hidden states at the scoring positions
            (after the final norm, i.e. the input of the output head).
        weight: (V, H) the output head's weight (the embedding matrix when tied).
        targets: (B, T) token ids; negative ids (ignore labels such as -100) get log-prob 0
            and no gradient.
        bias: (V,) the output head's bias, if it has one.
        temperature: divides the (capped) logits, ``tau``.
        chunk_size: token positions per chunk; the largest block alive is
            ``chunk_size x V`` float32 (``4 * chunk_size * V`` bytes, 620 MB for 1024 x 151,936).
        softcap: ``final_logit_softcapping`` of the model's config, or None.
        with_entropy: also compute the entropies (one more pass over each chunk).

    Returns:
        ``(logp, entropy)``: (B, T) log-probabilities, with gradient to ``hidden``,
        ``weight`` and ``bias``; (B, T) entropies in nats without gradient (a metric), or
        None without ``with_entropy``. Both float32 (float64 for float64 inputs).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be > 0 (or None), got {softcap}")
    if hidden.dim() != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be (B, T, H) and targets (B, T), got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"weight must be (V, H={hidden.shape[2]}), got {tuple(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be (V,) ({weight.shape[0]},), got {tuple(bias.shape)}")
    b, t, h = hidden.shape
    logp, entropy = _ChunkedHead.apply(
        hidden.reshape(b * t, h),
        weight,
        bias,
        targets.reshape(b * t),
        float(temperature),
        int(chunk_size),
        None if softcap is None else float(softcap),
        with_entropy,
    )
    return logp.view(b, t), None if entropy is None else entropy.view(b, t)


# --------------------------------------------------------------------------- a model's log-probs


def batch_logprobs(
    model: Any,
    batch: dict[str, torch.Tensor],
    temperature: float,
    ctx: Any,
    *,
    with_entropy: bool = True,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities of the batch's own next tokens, and entropies (B, T).

    Only the T positions of ``loss_mask`` are scored (see :func:`batch_tensors`). The
    entropies are None unless ``with_entropy``; they carry no gradient. With a
    ``chunk_size`` the output head runs ``chunk_size`` positions at a time
    (:func:`chunked_logprobs_and_entropy`), for models whose
    head allows it (:func:`chunkable_head`); otherwise the whole (B, T, V) logits are
    formed.
    """
    kept = batch["loss_mask"].shape[1]
    targets = batch["input_ids"][:, -kept:]
    head = chunkable_head(model) if chunk_size else None
    if head is not None:
        out = _chunked_logprobs(
            model, head, batch, targets, temperature, ctx, with_entropy, chunk_size
        )
        if out is not None:
            return out
    with ctx:
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            logits_to_keep=kept + 1,
            use_cache=False,  # a scoring pass: nothing to cache
        ).logits
    logits = logits[:, :-1].float()  # (B, T, V): the last position predicts nothing
    logp = token_logprobs(logits, targets, temperature=temperature)
    if not with_entropy:
        return logp, None
    return logp, entropy_from_logits(logits.detach(), temperature=temperature)


class _Head(NamedTuple):
    """Where the chunked log-probs take the model apart: decoder output -> projection."""

    decoder: Any
    """The module whose output's ``last_hidden_state`` is the head's input."""
    linear: torch.nn.Linear
    softcap: float | None
    """``final_logit_softcapping``: ``logits = cap * tanh(logits / cap)``."""


# Config fields of heads that rescale their logits beyond a soft cap.
_SCALED_HEAD_FIELDS = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier")
# Models the chunked path gave up on (each logged once), scored from whole logits since.
_WHOLE_LOGITS: weakref.WeakSet[Any] = weakref.WeakSet()


def chunkable_head(model: Any) -> _Head | None:
    """The model's decoder and output head, or None when its logits are not ``cap(h W^T + b)``."""
    if model in _WHOLE_LOGITS:
        return None
    config = model.config.get_text_config() if hasattr(model, "config") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    scaled = [f for f in _SCALED_HEAD_FIELDS if getattr(config, f, None) not in (None, 1, 1.0)]
    if not isinstance(head, torch.nn.Linear):
        reason = f"its output head is a {type(head).__name__}, not a Linear"
    elif decoder is None or decoder is model:
        reason = "it has no separate decoder module to take the hidden states from"
    elif scaled:
        reason = f"its config rescales the logits ({', '.join(scaled)})"
    else:
        softcap = getattr(config, "final_logit_softcapping", None)
        return _Head(decoder, head, float(softcap) if softcap else None)
    _whole_logits(model, reason)
    return None


def _whole_logits(model: Any, reason: str) -> None:
    _WHOLE_LOGITS.add(model)
    log.warning(
        "logprob_chunk_size: %s is scored from its whole (B, T, V) logits, not in chunks, "
        "because %s; memory grows with sequence length x vocabulary",
        type(model).__name__,
        reason,
    )


def _chunked_logprobs(
    model: Any,
    head: _Head,
    batch: dict[str, torch.Tensor],
    targets: torch.Tensor,
    temperature: float,
    ctx: Any,
    with_entropy: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """:func:`batch_logprobs` through the chunked head; None (logged) if the model turns out not to fit.

    The model runs as a whole (so FSDP gathers the head with the root, and hooks see an
    ordinary forward) with logits for its last position only; the decoder's output is
    taken on the way, and the head applied to it chunk by chunk. The model's own
    last-position logits check that the head is what :func:`chunkable_head` assumed.
    """
    captured: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, out: Any) -> None:
        captured.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

    hook = head.decoder.register_forward_hook(keep)
    try:
        with ctx:
            last = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                logits_to_keep=1,
                use_cache=False,  # a scoring pass: nothing to cache
            ).logits[:, -1]  # (B, V)
    finally:
        hook.remove()
    weight, bias = head.linear.weight, head.linear.bias
    if len(captured) != 1:
        _whole_logits(model, f"its decoder ran {len(captured)} times in one forward")
        return None
    if hasattr(weight, "full_tensor"):
        # FSDP resharded the root after its forward; the head's weight would have to be
        # gathered outside FSDP's bookkeeping of its gradient.
        _whole_logits(model, "its FSDP root module reshards the output head after forward")
        return None
    hidden = captured[0]  # (B, L, H)
    with torch.no_grad(), ctx:
        mine = torch.nn.functional.linear(hidden[:, -1], weight, bias).float()  # (B, V)
        if head.softcap is not None:
            mine = torch.tanh(mine / head.softcap) * head.softcap
        theirs = last.float()
        # Loose enough for the bf16 rounding of two differently shaped matmuls.
        tol = 1e-2 * max(1.0, float(theirs.abs().max()))
        same = mine.shape == theirs.shape and float((mine - theirs).abs().max()) <= tol
    if not same:
        _whole_logits(model, "its logits are not the projection of its decoder's last hidden state")
        return None
    kept = targets.shape[1]
    with ctx:
        return chunked_logprobs_and_entropy(
            hidden[:, -kept - 1 : -1],  # (B, T, H): the positions that predict the targets
            weight,
            targets,
            bias=bias,
            temperature=temperature,
            chunk_size=chunk_size,
            softcap=head.softcap,
            with_entropy=with_entropy,
        )
