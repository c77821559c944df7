"""Activation checkpointing of a Hugging Face decoder, switched on or off by a trainer.

Both trainers' ``gradient_checkpointing`` setting lands here: the layers' activations
are dropped in the forward and recomputed in the backward, trading about a third more
compute for activation memory that no longer grows with the layer count. One function,
so that SFT and GRPO checkpoint the same way (non-reentrant) under every transformers
version and warn alike for a model that cannot.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

__all__ = ["set_activation_checkpointing"]

log = logging.getLogger(__name__)

# Models that cannot checkpoint their activations (each logged once), updated without it.
_NO_CHECKPOINTING: weakref.WeakSet[Any] = weakref.WeakSet()


def set_activation_checkpointing(model: Any, on: bool) -> None:
    """Turn the decoder's activation checkpointing on or off, as ``gradient_checkpointing`` says.

    Hugging Face models recompute a checkpointed layer only in training mode, so the
    rollouts (sampled in eval mode, with the KV cache) run as before. Non-reentrant
    checkpointing: it needs no input that requires grad, and nests under FSDP2.
    """
    # transformers >= 5 names it "activation checkpointing"; the old names warn there.
    new = hasattr(model, "activation_checkpointing_enable")
    is_on = getattr(
        model, "is_activation_checkpointing" if new else "is_gradient_checkpointing", False
    )
    if bool(is_on) == on:
        return
    if not on:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        if model not in _NO_CHECKPOINTING:
            _NO_CHECKPOINTING.add(model)
            log.warning(
                "gradient_checkpointing: %s does not support activation checkpointing; its "
                "update keeps every layer's activations (set gradient_checkpointing=False "
                "to silence this)",
                type(model).__name__,
            )
        return
    kwargs = {"use_reentrant": False}
    if new:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
