"""The tokenizer adapter: an SFT row as token ids, with loss on the target action only.

The row is rendered with the model's own chat template; tool calls are written in a
tool protocol's text syntax (what the env parses) or passed as structured
``tool_calls`` for templates that render them. A row that does not fit is rejected,
never clipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from bat_gym.core.protocol import ToolCall, ToolProtocol, get_protocol
from bat_gym.sft.rows import IGNORE_INDEX, SFTRejected, SFTRejection, SFTRenderError, SFTRow

__all__ = ["chat_messages", "render_sft", "render_rows"]


def _calls_of(message: dict[str, Any]) -> list[ToolCall]:
    """The calls of an OpenAI assistant message (arguments decoded from JSON)."""
    out = []
    for item in message.get("tool_calls") or []:
        fn = item["function"]
        args = fn["arguments"]
        out.append(
            ToolCall(
                name=fn["name"],
                arguments=json.loads(args) if isinstance(args, str) else dict(args),
                id=item.get("id", ""),
            )
        )
    return out


def _assistant(content: str, calls: Sequence[ToolCall], proto: ToolProtocol | None) -> dict:
    if proto is not None:
        # Tool syntax written by the protocol as plain text: exactly what the env parses.
        return {"role": "assistant", "content": proto.render(content, list(calls))}
    # Structured calls for a template that renders `tool_calls` itself; dict arguments,
    # as the Hugging Face chat-template convention asks.
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {
                "id": c.id or f"call_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": dict(c.arguments)},
            }
            for i, c in enumerate(calls)
        ]
    return msg


def chat_messages(
    row: SFTRow, protocol: str | ToolProtocol | None = "hermes"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The row as chat-template input: context messages and the target assistant message.

    Args:
        row: the SFT row.
        protocol: write tool calls (context and target alike) as text in this protocol;
            ``None`` passes them as structured ``tool_calls`` for the template to render.

    Returns:
        ``(context, target)``: the messages before the target, and the target message.
    """
    proto = get_protocol(protocol) if protocol is not None else None
    context: list[dict[str, Any]] = []
    for m in row.context:
        if m["role"] == "assistant":
            context.append(_assistant(m.get("content") or "", _calls_of(m), proto))
        else:
            context.append({k: v for k, v in m.items() if v is not None})
    return context, _assistant(row.target.content, row.target.calls, proto)


def _ids(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    return list(out["input_ids"])


def render_sft(
    row: SFTRow,
    tokenizer: Any,
    max_length: int,
    protocol: str | ToolProtocol | None = "hermes",
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    pad: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> dict[str, list[int]]:
    """Tokenize a row with the tokenizer's own chat template; loss on the target only.

    The target span is the full conversation's tokens after the prompt rendered with
    ``add_generation_prompt=True``, less trailing whitespace-only tokens (the
    template's separator after the end-of-turn marker). The span thus covers the
    target action and the template's end-of-turn token, which teaches the model to stop.

    Args:
        row: the SFT row.
        tokenizer: a Hugging Face tokenizer with a chat template.
        max_length: the most tokens a rendered row may have.
        protocol: tool-call syntax for assistant turns (see :func:`chat_messages`).
        tools: tool schemas passed to the template (``tools=``), for templates that
            describe them in the system turn.
        pad: right-pad to ``max_length`` (padding gets label -100, attention 0).
        chat_template_kwargs: extra ``apply_chat_template`` arguments, e.g.
            ``{"enable_thinking": False}`` for Qwen3 (the prompt then ends with the empty
            ``<think>`` block the template adds, and the target is the answer after it);
            give GRPO and evaluation the same.

    Returns:
        ``input_ids``, ``labels``, ``attention_mask``: lists of ints of length ``n``
        (``max_length`` when padded); ``labels[i]`` is ``input_ids[i]`` on the target
        span and -100 elsewhere.

    Raises:
        SFTRejected: the rendering is longer than ``max_length`` (reason ``too_long``).
        SFTRenderError: the prompt's tokens are not a prefix of the full conversation's,
            or the span is empty or does not hold the target.
    """
    context, target = chat_messages(row, protocol)
    kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
    if tools:
        kwargs["tools"] = list(tools)
    prompt = _ids(tokenizer, context, add_generation_prompt=True, **kwargs)
    full = _ids(tokenizer, [*context, target], **kwargs)
    if len(full) > max_length:
        raise SFTRejected(row.row_id, "too_long", f"{len(full)} tokens > max_length {max_length}")
    if full[: len(prompt)] != prompt:
        pairs = zip(prompt, full, strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(prompt), len(full)))
        raise SFTRenderError(
            f"SFT row {row.row_id}: the chat template's prompt (add_generation_prompt=True) "
            f"is not a token prefix of the full conversation (first difference at token {at}); "
            "the target span cannot be located"
        )
    end = len(full)
    while end > len(prompt) and not tokenizer.decode(full[len(prompt) : end][-1:]).strip():
        end -= 1
    span = tokenizer.decode(full[len(prompt) : end])
    # Text mode: the protocol's rendering must be there verbatim; structured mode: the
    # template writes the calls its own way, so look for the content and call names.
    wanted = [target["content"].strip()] if protocol is not None else [row.target.content.strip()]
    if protocol is None:
        wanted += [c.name for c in row.target.calls]
    if end == len(prompt) or not all(w in span for w in wanted):
        raise SFTRenderError(
            f"SFT row {row.row_id}: the tokens after the prompt do not hold the target action"
        )
    labels = [IGNORE_INDEX] * len(prompt) + full[len(prompt) : end]
    labels += [IGNORE_INDEX] * (len(full) - end)
    attention = [1] * len(full)
    if pad and len(full) < max_length:
        # Some tokenizers have no pad token; the attention mask makes any id harmless.
        pad_id = tokenizer.pad_token_id
        if pad_id is None:
            pad_id = tokenizer.eos_token_id or 0
        extra = max_length - len(full)
        full = full + [pad_id] * extra
        labels += [IGNORE_INDEX] * extra
        attention += [0] * extra
    return {"input_ids": full, "labels": labels, "attention_mask": attention}


def render_rows(
    rows: Iterable[SFTRow],
    tokenizer: Any,
    max_length: int,
    protocol: str | ToolProtocol | None = "hermes",
    **kwargs: Any,
) -> tuple[list[tuple[SFTRow, dict[str, list[int]]]], list[SFTRejection]]:
    """Render many rows; the ones that do not fit come back as rejections.

    Returns:
        ``(rendered, rejected)``: ``(row, render_sft output)`` pairs in input order,
        and the rejections with their reasons.
    """
    rendered, rejected = [], []
    for row in rows:
        try:
            rendered.append((row, render_sft(row, tokenizer, max_length, protocol, **kwargs)))
        except SFTRejected as exc:
            rejected.append(exc.rejection)
    return rendered, rejected
