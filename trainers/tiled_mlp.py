"""Sequence-tiled MLPs: a decoder's feed-forward blocks run a few thousand tokens at a time.

At long sequences the largest activations of a decoder layer are its MLP's
intermediates: a gated MLP holds three ``(tokens, intermediate)`` tensors (gate, up and
their product), 0.6 GB each for 32,768 tokens at Qwen2.5-0.5B's width (intermediate
4,864, fp32), while the layer's input and output are ``(tokens, hidden)``, five times
smaller. Activation checkpointing drops them between layers but not inside the layer
being recomputed, so at micro-batch 4 of 8k-token episodes they, not the logits, set
the update's peak.

The MLP acts on each token alone, so it can run over the tokens in tiles: the forward
keeps only its input, and the backward recomputes one tile at a time and backpropagates
it before the next (the sequence tiling of Arctic Long Sequence Training's
``TiledMLP``). The output and every gradient are those of the untiled MLP up to float
summation order; the cost is one more MLP forward per update. Only dense gated MLPs
(``gate_proj``, ``up_proj``, ``down_proj`` and no other parameters) are tiled; a model
without them updates as before.

The parameters are inputs of the autograd function, so their gradients reach them
through autograd like any other operation's (under FSDP2 too), never by writing
``.grad`` from inside a backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["set_mlp_tiling", "tiled_mlp"]

_ORIGINAL = "_bat_gym_untiled_forward"
_MLP_PARAMS = ("gate_proj", "up_proj", "down_proj")


class _TiledMLP(torch.autograd.Function):
    """``fn(x)`` over the rows of ``x`` (tokens, hidden), ``tile`` rows at a time."""

    @staticmethod
    def forward(ctx: Any, fn: Callable, tile: int, x: torch.Tensor, *params: torch.Tensor):
        ctx.fn, ctx.tile = fn, tile
        # The backward recomputes under the forward's autocast, as checkpointing does.
        kind = x.device.type
        ctx.autocast = (kind, torch.get_autocast_dtype(kind), torch.is_autocast_enabled(kind))
        ctx.save_for_backward(x, *params)
        with torch.no_grad():
            return torch.cat([fn(x[s]) for s in _tiles(x.shape[0], tile)])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        x, *params = ctx.saved_tensors
        wanted = [p for p in params if p.requires_grad]
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[2] else None
        grad_params = [torch.zeros_like(p) for p in wanted]
        kind, dtype, enabled = ctx.autocast
        for s in _tiles(x.shape[0], ctx.tile):
            with torch.enable_grad(), torch.autocast(kind, dtype=dtype, enabled=enabled):
                xs = x[s].detach().requires_grad_(grad_x is not None)
                ys = ctx.fn(xs)
            inputs = ([xs] if grad_x is not None else []) + wanted
            grads = torch.autograd.grad(ys, inputs, grad_out[s], allow_unused=True)
            if grad_x is not None:
                grad_x[s], grads = grads[0], grads[1:]
            for acc, g in zip(grad_params, grads, strict=True):
                if g is not None:
                    acc += g
        it = iter(grad_params)
        return (None, None, grad_x, *(next(it) if p.requires_grad else None for p in params))


def _tiles(n: int, tile: int) -> Iterator[slice]:
    for start in range(0, n, tile):
        yield slice(start, min(start + tile, n))


def tiled_mlp(mlp: torch.nn.Module, x: torch.Tensor, tile: int, forward: Callable) -> torch.Tensor:
    """``forward(x)`` for ``x`` of shape (..., hidden), over ``tile`` tokens at a time.

    ``forward`` is the MLP's own (untiled) forward; ``mlp``'s parameters are the
    function's inputs. Without grad, or with at most one tile of tokens, it is
    ``forward(x)`` itself.
    """
    flat = x.reshape(-1, x.shape[-1])
    if not torch.is_grad_enabled() or flat.shape[0] <= tile:
        return forward(x)
    out = _TiledMLP.apply(forward, tile, flat, *mlp.parameters())
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _dense_mlps(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Each dense gated MLP of the model: gate, up and down projections, nothing else."""
    for name, module in model.named_modules():
        if not name.endswith("mlp") or not all(hasattr(module, p) for p in _MLP_PARAMS):
            continue
        own = {n.split(".")[0] for n, _ in module.named_parameters()}
        if own <= set(_MLP_PARAMS):
            yield module


def set_mlp_tiling(model: torch.nn.Module, tile: int | None) -> int:
    """Run the model's dense MLPs ``tile`` tokens at a time (None: untiled, as loaded).

    Idempotent, and reversible: the module tree and the state dict are unchanged (the
    tiling lives in each MLP's instance ``forward``). Returns how many MLPs are tiled.
    """
    count = 0
    for mlp in _dense_mlps(model):
        if _ORIGINAL in mlp.__dict__:  # tiled before: restore what ``forward`` was
            prior = mlp.__dict__.pop(_ORIGINAL)
            if prior is None:
                del mlp.__dict__["forward"]
            else:
                mlp.__dict__["forward"] = prior
        if tile is None:
            continue
        # The instance's own ``forward`` if something set one, else None (the class's).
        mlp.__dict__[_ORIGINAL] = mlp.__dict__.get("forward")
        mlp.__dict__["forward"] = _bind(mlp, mlp.forward, tile)
        count += 1
    return count


def _bind(mlp: torch.nn.Module, own: Callable, tile: int) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return tiled_mlp(mlp, x, tile, own)

    return forward
