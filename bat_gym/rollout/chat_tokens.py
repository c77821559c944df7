r"""Chat-template token arithmetic: prompts, stop tokens and env replies as token ids.

Token-in-token-out training appends each env reply after the tokens the model sampled;
this module says what those reply tokens are for a tokenizer's chat template, and which
tokens end a turn. :class:`~bat_gym.rollout.token_episode.TokenEpisode` is its user.

**What ends a turn.** An episode and its sampler must agree on the stop tokens: a
turn whose last token is one of ``stop_token_ids`` is complete; any other turn was cut
by a token limit. Give the sampler's own ids (``policy.stop_token_ids``); the default,
:func:`default_stop_token_ids`, is the template's end-of-turn token (``<|im_end|>``
for ChatML, found by rendering a probe conversation) and the tokenizer's
``eos_token_id``, which for Qwen base tokenizers is ``<|endoftext|>``, not the token
that ends a chat turn.


**Templates that re-render earlier turns.** Some chat templates render a turn one way
while it is the last message and another way once messages follow (Qwen3's drops an
empty ``<think></think>`` block from assistant turns that are not last, and the
reasoning of every assistant turn before the last user message). The sampled tokens
then are not what the template renders for the conversation, and the reply cannot be
the plain difference of two renderings. The episode keeps the sampled tokens (they are
what the model was conditioned on and what it is trained on) and takes the reply
tokens from the template: the tokens after the end of the assistant turn in the
rendering with the new messages, an end found by rendering a marker in place of the
assistant's text (:func:`reply_delta`). Such replies are counted in
``EpisodeResult.rerendered_replies``. Limits:

* the training context then differs from what the template renders for the whole
  conversation, which is what an evaluation that re-renders each turn conditions on:
  with Qwen3 and ``enable_thinking=False``, earlier assistant turns keep the empty
  ``<think>\n\n</think>\n\n`` the generation prompt put before them; with thinking on,
  an assistant turn with empty reasoning, and the reasoning of turns before a later user
  message (bat_gym's tool-call errors are user messages), stay in the context. In an
  agent episode (one user message, then assistant and tool turns whose reasoning is not
  empty) Qwen3's template keeps the reasoning of every turn, and training and
  evaluation see the same tokens;
* a template that does not write the assistant's text as it is, or ends an assistant
  turn with none of the stop tokens, cannot be aligned this way:
  :class:`ChatTemplateError` names it. ``rerendering="error"`` refuses every
  re-rendering template, for runs that must train on exactly what evaluation renders.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from bat_gym.core.errors import BatGymError

__all__ = [
    "ChatTemplateError",
    "RERENDERED_TEMPLATE",
    "ReplyDelta",
    "default_stop_token_ids",
    "delta_ids",
    "end_of_turn_id",
    "render_ids",
    "reply_delta",
]

# Texts no template writes itself: the assistant's and the reply's content in the
# renderings that locate a turn's end-of-turn token.
_PROBE = "bat-gym end-of-turn probe"
_REPLY_PROBE = "bat-gym reply probe"


class ChatTemplateError(BatGymError, ValueError):
    """The chat template cannot give the tokens of an env reply after a sampled turn.

    Token-in-token-out training appends each env reply after the sampled tokens; the
    reply's tokens are what the template writes after the assistant turn.
    """


def render_ids(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template."""
    ids = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        **(chat_template_kwargs or {}),
    )
    return [int(i) for i in ids]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or ()}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i, token in added.items() if getattr(token, "special", False))
    return ids


def end_of_turn_id(
    tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> int | None:
    """The special token the chat template closes an assistant turn with, or None.

    Found by rendering a user turn and an assistant turn: the first special token after
    the assistant's text (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3,
    ``<end_of_turn>`` for Gemma). None when the template writes no special token there
    or cannot render the probe.
    """
    probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(
            probe, tokenize=False, add_generation_prompt=False, **(chat_template_kwargs or {})
        )
    except Exception:  # jinja raises its own types; then there is no token to find
        return None
    at = text.rfind(_PROBE) if isinstance(text, str) else -1
    if at < 0:
        return None
    special = _special_ids(tokenizer)
    tail = tokenizer.encode(text[at + len(_PROBE) :], add_special_tokens=False)
    return next((int(t) for t in tail if int(t) in special), None)


def default_stop_token_ids(
    tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """The tokens that end a turn in this tokenizer's chat format, end-of-turn first.

    The template's end-of-turn token (:func:`end_of_turn_id`) and ``eos_token_id``:
    what a sampler of chat turns stops at when it is given no stop ids of its own.
    """
    ids: list[int] = []
    eot = end_of_turn_id(tokenizer, chat_template_kwargs)
    if eot is not None:
        ids.append(eot)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and eos not in ids:
        ids.append(eos)
    return ids


class ReplyDelta(NamedTuple):
    """The tokens of an env reply, and whether the template re-rendered earlier turns."""

    ids: list[int]
    """What the template writes after the assistant turn, generation prompt included."""
    rerendered: bool
    """True when the rendering with the reply does not start with the one without it."""


def reply_delta(
    tokenizer: Any,
    before: Sequence[dict[str, Any]],
    new: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    *,
    stop_token_ids: Collection[int],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> ReplyDelta:
    """The tokens the template writes after a generated turn when ``new`` messages follow.

    ``before`` ends with the assistant turn. Its rendering is cut after its last stop
    token (the end-of-turn token the model sampled), so what the template writes after
    that token (e.g. the newline after Qwen's ``<|im_end|>``) belongs to the reply, as the
    model never sampled it.

    When the rendering of ``before + new`` starts with that of ``before`` (a
    prefix-preserving template), the reply is the rest. Otherwise the template
    re-rendered earlier turns or the assistant turn itself, and the stop token that
    closes the assistant turn in the rendering of ``before + new`` is found by rendering
    it once more with markers as the assistant's text and the first reply's: the earlier
    turns are rendered as in ``full``, so the closing token is the ``k+1``-th stop token
    of ``full``, with ``k`` the stop tokens before the assistant's marker, and it must
    lie between the two markers.

    Raises:
        ChatTemplateError: the template re-renders earlier turns and does not write the
            assistant's text, or does not end its turn with one of ``stop_token_ids``,
            so the reply cannot be located.
    """
    kwargs = chat_template_kwargs or {}
    head = render_ids(
        tokenizer, before, tools, add_generation_prompt=False, chat_template_kwargs=kwargs
    )
    full = render_ids(
        tokenizer, [*before, *new], tools, add_generation_prompt=True, chat_template_kwargs=kwargs
    )
    stops = [i for i, t in enumerate(head) if t in stop_token_ids]
    if stops:
        head = head[: stops[-1] + 1]
    if full[: len(head)] == head:
        return ReplyDelta(full[len(head) :], False)
    # Mark the assistant's text (and the reply's) and render again: the stop tokens
    # before the marker are the earlier turns', in the same rendering as ``full``.
    marked_new = [dict(m) for m in new]
    if marked_new and isinstance(marked_new[0].get("content"), str):
        marked_new[0]["content"] = _REPLY_PROBE
    text = tokenizer.apply_chat_template(
        [*before[:-1], {**before[-1], "content": _PROBE}, *marked_new],
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=False,
        **kwargs,
    )
    at = text.find(_PROBE)
    reply_at = text.find(_REPLY_PROBE, at) if at >= 0 else -1
    if reply_at < 0:  # no marked reply text to bound the turn with
        reply_at = len(text)
    earlier = sum(
        1
        for t in tokenizer.encode(text[: max(at, 0)], add_special_tokens=False)
        if t in stop_token_ids
    )
    closed = any(
        t in stop_token_ids
        for t in tokenizer.encode(text[at + len(_PROBE) : reply_at], add_special_tokens=False)
    )
    full_stops = [i for i, t in enumerate(full) if t in stop_token_ids]
    if at < 0 or not closed or earlier >= len(full_stops):
        raise ChatTemplateError(
            "the chat template renders earlier turns differently once the env's reply is "
            "appended, and the end of the assistant turn cannot be found in the new "
            "rendering: the template does not write the assistant's text as it is, or does "
            f"not end the turn with one of the stop tokens {sorted(stop_token_ids)} before "
            "the reply; pass the template's end-of-turn token in stop_token_ids, or use a "
            "prefix-preserving template"
        )
    return ReplyDelta(full[full_stops[earlier] + 1 :], True)


def delta_ids(
    tokenizer: Any,
    before: Sequence[dict[str, Any]],
    new: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    **options: Any,
) -> list[int]:
    """:func:`reply_delta` (same arguments) of a prefix-preserving template; refuses any other.

    Raises:
        ChatTemplateError: the template is not prefix-preserving.
    """
    delta = reply_delta(tokenizer, before, new, tools, **options)
    if delta.rerendered:
        raise ChatTemplateError(RERENDERED_TEMPLATE)
    return delta.ids


RERENDERED_TEMPLATE = (  # why a template that is not prefix-preserving is refused
    "the chat template renders the conversation differently once tool results are "
    "appended (it is not prefix-preserving), so the context the model was sampled from "
    "differs from what the template renders for the conversation; use a prefix-preserving "
    "template (for thinking models, one that keeps earlier turns' reasoning), or "
    "rerendering='follow_sampled' to train on the sampled context"
)
