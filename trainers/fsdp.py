"""The GRPO trainer's torch-distributed side: FSDP2 sharding, rollouts, full checkpoints.

Launched with ``torchrun --nproc-per-node N``, every rank holds a shard of the policy
(``fully_shard`` per decoder layer, then the root). Three things differ from one
process:

* Rollouts: generation calls the model once per decoded token, a different number of
  times on every rank, while a sharded forward is a collective (an all-gather per
  layer). :func:`gathered` all-gathers the weights once for the whole rollout phase
  and keeps them, so generation is local; they are resharded before the update.
* The update: every rank must run the same number of forward/backward passes (each is
  a collective too); :meth:`Dist.all_max` tells a rank how many to pad with.
* Checkpoints: every rank takes part in gathering a full (unsharded) state dict onto
  rank 0, which writes it, so a checkpoint is an ordinary Hugging Face directory that
  one process can load, resume from, or evaluate.

With one process every function here is a no-op or the plain single-process call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Dist", "init_distributed", "shard", "gathered", "full_state", "load_optimizer_state"]


@dataclass(frozen=True)
class Dist:
    """This process's place in the job: ``rank`` of ``world`` (1: no torch.distributed)."""

    rank: int = 0
    world: int = 1

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` over ranks, in place (a no-op with one process)."""
        if self.world > 1:
            torch.distributed.all_reduce(values)
        return values

    def all_gather(self, items: list[Any]) -> list[Any]:
        """Every rank's ``items`` (picklable), concatenated in rank order."""
        if self.world == 1:
            return list(items)
        parts: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(parts, items)
        return [x for part in parts for x in part]

    def all_max(self, value: int) -> int:
        """The largest ``value`` any rank holds."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.long, device=_collective_device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())


def _collective_device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo takes CPU tensors.
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes (WORLD_SIZE/RANK); one process otherwise.

    CUDA ranks use NCCL on the GPU of their LOCAL_RANK; CPU ranks use gloo.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=torch.distributed.get_rank(), world=world)


def shard(model: Any, dist: Dist) -> Any:
    """FSDP2: shard each decoder layer, then the rest (embeddings, norm, head)."""
    if dist.world == 1:
        return model
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    # Each rank's loss is already its share of the global mean (divided by the global
    # normaliser), so the ranks' gradients add up: sum them, not the default average.
    for m in _fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        # A plain SUM collective (gloo has no pre-multiplied sum; NCCL copies less).
        m.set_force_sum_reduction_for_comms(True)
    return model


def _fsdp_modules(model: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: Any, dist: Dist) -> Iterator[None]:
    """Keep the full weights on every rank inside the block (rollouts), then reshard.

    ``unshard`` is not recursive, so every FSDP module is unsharded; with
    reshard-after-forward off, the many decoding forwards find the weights in place
    and issue no collective. Afterwards the layers reshard after forward again and the
    root keeps its weights after forward (``fully_shard``'s own default for the root):
    the chunked log-probs apply the root's output head after the forward returns.
    """
    if dist.world == 1:
        yield
        return
    modules = _fsdp_modules(model)
    model.set_reshard_after_forward(False)
    for m in modules:
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()
        model.set_reshard_after_forward(True)
        model.set_reshard_after_forward(False, recurse=False)


def full_state(
    model: Any, opt: torch.optim.Optimizer | None, dist: Dist, *, every_rank: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """The full model (and optimizer) state dicts; a collective on every rank.

    By default they land on rank 0 only, on CPU (for writing a checkpoint; other ranks
    get empty dicts). ``every_rank`` gives every rank the full weights on its device
    (for a vLLM engine per rank). With one process: the ordinary ``state_dict()``s. The
    optimizer's is None when ``opt`` is.
    """
    if dist.world == 1:
        return model.state_dict(), None if opt is None else opt.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank)
    weights = get_model_state_dict(model, options=options)
    if opt is None:
        return weights, None
    return weights, get_optimizer_state_dict(model, opt, options=options)


def load_optimizer_state(
    model: Any, opt: torch.optim.Optimizer, state: dict[str, Any], dist: Dist
) -> None:
    """Load an optimizer state that :func:`full_state` saved, sharding it as the model is.

    The state is keyed by parameter index with one process and by parameter name with
    several, so a run resumes under the number of processes it was started with.
    """
    if dist.world == 1:
        opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, opt, optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
    )
