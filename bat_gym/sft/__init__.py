"""The SFT view of the Stage Bank: one row per teacher action, tokenized per model.

* :mod:`bat_gym.sft.rows`: :class:`SFTRow` (context plus exactly one model-neutral
  target action) and :func:`sft_rows`, which replays the bank's E2E success
  trajectories to build them.
* :mod:`bat_gym.sft.render`: :func:`render_sft`, the tokenizer adapter (the model's own
  chat template; loss on the target action only; too-long rows rejected, not clipped).
* :mod:`bat_gym.sft.export`: :func:`split_rows` (grouped by source trajectory) and
  :func:`export_sft` (``train.jsonl``, ``validation.jsonl``, ``manifest.json``).
"""

from bat_gym.sft.export import export_sft, split_rows
from bat_gym.sft.render import chat_messages, render_rows, render_sft
from bat_gym.sft.rows import (
    IGNORE_INDEX,
    SFTAction,
    SFTRejected,
    SFTRejection,
    SFTRenderError,
    SFTRow,
    sft_rows,
)

__all__ = [
    "IGNORE_INDEX",
    "SFTAction",
    "SFTRow",
    "SFTRejection",
    "SFTRejected",
    "SFTRenderError",
    "sft_rows",
    "chat_messages",
    "render_sft",
    "render_rows",
    "split_rows",
    "export_sft",
]
