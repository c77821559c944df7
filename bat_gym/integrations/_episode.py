"""TokenEpisode: one bat_gym episode as the token sequence a trainer learns from.

Every trainer adapter shares this bookkeeping, so prompts, tool results, masks and
rewards cannot drift between frameworks. The env stays the only source of prompts,
tool semantics and rewards; this class only turns its text into tokens:

* the prompt is the env's conversation (``info["messages"]``, ``info["tools"]``)
  rendered by the tokenizer's chat template with the generation prompt;
* a turn's sampled tokens are appended as they are (token in, token out), with
  ``response_mask`` 1, and their text is the env's action;
* the env's reply is appended with ``response_mask`` 0, as the chat-template delta
  between the conversation with and without the new messages (see :func:`delta_ids`).

Formally, with ``g_t`` the tokens sampled at turn ``t`` and ``o_t`` the reply's tokens::

    response_ids  = g_1 + o_1 + g_2 + o_2 + ... + g_T
    response_mask = [1]*|g_1| + [0]*|o_1| + ... + [1]*|g_T|

The last reply (e.g. ``finish``'s "Finished.") is not appended: nothing is generated
after it. The reward is the env's final-step reward (the rubric verdict under
:class:`~bat_gym.rubrics.reward.RubricReward`).

>>> episode = TokenEpisode(env, tokenizer, max_response_tokens=4096)  # doctest: +SKIP
>>> result = episode.run(lambda context_ids, max_new: sample(context_ids, max_new))  # doctest: +SKIP
>>> result.reward, sum(result.response_mask)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

from bat_gym.completion import Completion
from bat_gym.errors import BatGymError

__all__ = [
    "ChatTemplateError",
    "EpisodeResult",
    "Generate",
    "StopReason",
    "TokenEpisode",
    "delta_ids",
    "render_ids",
    "rubric_wrapper",
]

StopReason = Literal["terminated", "truncated", "length"]
"""Why an episode ended: the policy called ``finish``; an env budget ran out; or the
adapter's token budget (``max_response_tokens``) left no room for another turn."""

Generate = Callable[[list[int], int | None], Sequence[int]]
"""``generate(context_ids, max_new_tokens) -> sampled token ids`` (None: no limit)."""


class ChatTemplateError(BatGymError, ValueError):
    """The chat template re-renders earlier turns when new messages are appended.

    Token-in-token-out training needs a prefix-preserving template: the conversation
    rendered with new messages must start with the conversation rendered without them.
    """


@dataclass
class EpisodeResult:
    """One finished episode, token side and env side.

    Attributes:
        state_id: the Stage Bank state the episode started from.
        prompt_ids: the rendered prompt, shape ``(P,)``.
        response_ids: sampled tokens and env replies, shape ``(R,)``.
        response_mask: 1 for sampled tokens, 0 for env reply tokens, shape ``(R,)``.
        response_logprobs: per-token log-probabilities of the sampled tokens (0.0 on
            env tokens), shape ``(R,)``; None when the generator gave none.
        reward: the env's final-step reward (the rubric reward under RubricReward).
        verdict: the rubric verdict (``info["verdict"]``); None for a bare env.
        num_turns: assistant turns generated (those the env stepped, plus a turn the
            token budget cut).
        num_replies: env replies appended to ``response_ids``.
        stop_reason: why the episode ended.
        messages: the env's conversation at the end (OpenAI chat format).
        observations: the env's reply text to each stepped turn, in order (``obs``
            of ``step``), the last one included.
        info: the env's last ``info``.
    """

    state_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward: float
    verdict: Any
    num_turns: int
    num_replies: int
    stop_reason: StopReason
    messages: list[dict[str, Any]]
    observations: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def reward_or_none(self) -> float | None:
        """The reward, or None when the verdict is null (drop the rollout, don't score 0)."""
        if self.verdict is not None and self.verdict.reward is None:
            return None
        return self.reward


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


def delta_ids(
    tokenizer: Any,
    before: Sequence[dict[str, Any]],
    new: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    *,
    stop_token_ids: Collection[int],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The tokens the template adds after a generated turn when ``new`` messages follow.

    ``before`` ends with the assistant turn. Its rendering is cut after its last stop
    token (the end-of-turn token the model sampled), so what the template writes after
    that token (e.g. the newline after Qwen's ``<|im_end|>``) belongs to the reply, as the
    model never sampled it.

    Raises:
        ChatTemplateError: the template is not prefix-preserving.
    """
    head = render_ids(
        tokenizer,
        before,
        tools,
        add_generation_prompt=False,
        chat_template_kwargs=chat_template_kwargs,
    )
    full = render_ids(
        tokenizer,
        [*before, *new],
        tools,
        add_generation_prompt=True,
        chat_template_kwargs=chat_template_kwargs,
    )
    stops = [i for i, t in enumerate(head) if t in stop_token_ids]
    if stops:
        head = head[: stops[-1] + 1]
    if full[: len(head)] != head:
        raise ChatTemplateError(
            "the chat template renders the conversation differently once tool results are "
            "appended, so the sampled tokens cannot stay as they are; use a prefix-preserving "
            "template (for thinking models, one that keeps earlier turns' reasoning)"
        )
    return full[len(head) :]


def rubric_wrapper(env: gym.Env[str, str]) -> Any:
    """The :class:`~bat_gym.rubrics.reward.RubricReward` in ``env``'s wrapper stack, or None."""
    from bat_gym.rubrics.reward import RubricReward

    while True:
        if isinstance(env, RubricReward):
            return env
        inner = getattr(env, "env", None)
        if inner is None:
            return None
        env = inner


class TokenEpisode:
    """Drive one bat_gym env through reset/step on token ids.

    Use :meth:`run` with a ``generate`` callable, or, for batched or async
    generation, :meth:`reset` (or :meth:`begin`) then :meth:`advance` with each turn's
    sampled tokens until :attr:`done`, reading :attr:`context_ids` and
    :attr:`max_new_tokens` before each turn.

    Args:
        env: a bat_gym env (``gym.make("bat/...-v0")`` or a StageEnv with wrappers).
        tokenizer: a Hugging Face tokenizer with a tool-capable chat template.
        max_response_tokens: budget for ``response_ids`` (sampled plus reply tokens),
            e.g. verl's ``response_length`` or TRL's ``max_completion_length``; None: no
            budget beyond the env's own.
        max_new_tokens_per_turn: cap on one turn's sampled tokens; None: the remaining
            budget only.
        stop_token_ids: the end-of-turn tokens the generator stops at; default: the
            tokenizer's ``eos_token_id``.
        chat_template_kwargs: extra arguments of ``apply_chat_template`` (e.g.
            ``{"enable_thinking": False}``).
    """

    def __init__(
        self,
        env: gym.Env[str, str],
        tokenizer: Any,
        *,
        max_response_tokens: int | None = None,
        max_new_tokens_per_turn: int | None = None,
        stop_token_ids: Collection[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        for name, value in (
            ("max_response_tokens", max_response_tokens),
            ("max_new_tokens_per_turn", max_new_tokens_per_turn),
        ):
            # A budget of 0 could never hold a turn: the episode would end unplayed.
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of tokens or None, got {value}")
        if stop_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            stop_token_ids = () if eos is None else (eos,)
        self.env = env
        self.tokenizer = tokenizer
        self.max_response_tokens = max_response_tokens
        self.max_new_tokens_per_turn = max_new_tokens_per_turn
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        # The token that closes a turn the generator left open: the first one given.
        self._close_token = next((int(t) for t in stop_token_ids), None)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._info: dict[str, Any] | None = None
        self._result: EpisodeResult | None = None
        self._tools: list[dict[str, Any]] = []
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self._logprobs: list[float] | None = []
        self.observations: list[str] = []
        self.num_turns = self.num_replies = 0

    # -- stepping ------------------------------------------------------------------------

    def reset(self, state_id: str | None = None, *, seed: int | None = None) -> list[int]:
        """Reset the env (to ``state_id`` when given) and return the prompt ids."""
        options = None if state_id is None else {"state_id": state_id}
        _, info = self.env.reset(seed=seed, options=options)
        return self.begin(info)

    def begin(self, info: dict[str, Any]) -> list[int]:
        """Start from an env that was just reset, given the ``info`` its reset returned."""
        self._info = info
        self._tools = list(info["tools"])
        self.prompt_ids = render_ids(
            self.tokenizer,
            info["messages"],
            self._tools,
            add_generation_prompt=True,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        self.response_ids = []
        self.response_mask = []
        self._logprobs = []
        self.observations = []
        self.num_turns = self.num_replies = 0
        self._result = None
        return list(self.prompt_ids)

    @property
    def done(self) -> bool:
        """Whether the episode has ended (then :meth:`result` is ready)."""
        return self._result is not None

    @property
    def context_ids(self) -> list[int]:
        """What the next turn is conditioned on: the prompt and the response so far."""
        return self.prompt_ids + self.response_ids

    @property
    def remaining_tokens(self) -> int | None:
        """Room left in ``max_response_tokens`` (None: no budget)."""
        if self.max_response_tokens is None:
            return None
        return self.max_response_tokens - len(self.response_ids)

    @property
    def max_new_tokens(self) -> int | None:
        """The most tokens the next turn may sample (None: no limit)."""
        caps = [c for c in (self.remaining_tokens, self.max_new_tokens_per_turn) if c is not None]
        return min(caps) if caps else None

    def advance(self, token_ids: Sequence[int], logprobs: Sequence[float] | None = None) -> bool:
        """Append one turn's sampled tokens, step the env with their text, append its reply.

        Args:
            token_ids: the tokens sampled for this turn (a stop token at the end, if any,
                included).
            logprobs: their log-probabilities, same length; None if unknown.

        Returns:
            Whether the episode has ended.
        """
        if self._info is None or self._result is not None:
            raise RuntimeError("advance() needs a started, unfinished episode: call reset() first")
        tokens = [int(t) for t in token_ids]
        if logprobs is not None and len(logprobs) != len(tokens):
            raise ValueError(
                f"expected one logprob per sampled token ({len(tokens)}), got {len(logprobs)}"
            )
        room = self.remaining_tokens
        stopped = bool(tokens) and tokens[-1] in self.stop_token_ids
        # A turn the budget cut is not a complete message: keep its tokens (the model
        # sampled them) but do not act on it.
        cut = room is not None and (len(tokens) > room or (len(tokens) == room and not stopped))
        if cut:
            tokens = tokens[:room]
            logprobs = None if logprobs is None else list(logprobs)[:room]
        self._append(tokens, 1, logprobs)
        self.num_turns += 1
        if cut:
            return self._finish("length", self._info, None)

        text = self._action_text(tokens)
        before = list(self._info["messages"])
        obs, reward, terminated, truncated, info = self.env.step(
            Completion(text, num_tokens=len(tokens))
        )
        self._info = info
        self.observations.append(obs)
        if terminated or truncated:
            return self._finish("terminated" if terminated else "truncated", info, float(reward))

        messages = info["messages"]
        reply = delta_ids(
            self.tokenizer,
            messages[: len(before) + 1],  # the conversation up to the new assistant turn
            messages[len(before) + 1 :],
            self._tools,
            stop_token_ids=self.stop_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        if not stopped and self._close_token is not None:
            # The turn ended without its end-of-turn token (a per-turn cap): close it
            # here so the context stays well formed; the model did not sample it.
            reply = [self._close_token, *reply]
        room = self.remaining_tokens
        if room is not None and len(reply) >= room:
            # No room for the reply and one more sampled token.
            return self._finish("length", info, None)
        self._append(reply, 0, None)
        self.num_replies += 1
        return False

    def run(self, generate: Generate, *, state_id: str | None = None) -> EpisodeResult:
        """Play one episode with ``generate(context_ids, max_new_tokens) -> token ids``.

        Resets the env to ``state_id`` first, unless an episode was already begun.
        """
        if self._info is None or self._result is not None:
            self.reset(state_id)
        while not self.done:
            self.advance(generate(self.context_ids, self.max_new_tokens))
        return self.result()

    def result(self) -> EpisodeResult:
        """The finished episode."""
        if self._result is None:
            raise RuntimeError("the episode has not ended yet; call advance() until done")
        return self._result

    # -- helpers -------------------------------------------------------------------------

    def _append(self, tokens: list[int], mask: int, logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(tokens)
        self.response_mask.extend([mask] * len(tokens))
        if self._logprobs is not None:
            if mask == 1 and logprobs is None and tokens:
                self._logprobs = None  # unknown for one turn: unknown for the episode
            else:
                self._logprobs.extend(
                    list(logprobs) if logprobs is not None else [0.0] * len(tokens)
                )

    def _action_text(self, tokens: list[int]) -> str:
        # The end-of-turn token is the generator's, not the message's.
        while tokens and tokens[-1] in self.stop_token_ids:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _finish(self, reason: StopReason, info: dict[str, Any], reward: float | None) -> bool:
        verdict = info.get("verdict")
        if reward is None:
            # Cut by the token budget mid-episode: score the workspace as it stands,
            # as the env does when one of its own budgets truncates the episode.
            rubric = rubric_wrapper(self.env)
            if rubric is not None:
                verdict = rubric.score_episode()
                rubric.last_verdict = verdict
                reward = 0.0 if verdict.reward is None else float(verdict.reward)
            else:
                reward = 0.0
        self._result = EpisodeResult(
            state_id=info["state_id"],
            prompt_ids=list(self.prompt_ids),
            response_ids=list(self.response_ids),
            response_mask=list(self.response_mask),
            response_logprobs=None if self._logprobs is None else list(self._logprobs),
            reward=reward,
            verdict=verdict,
            num_turns=self.num_turns,
            num_replies=self.num_replies,
            stop_reason=reason,
            messages=list(info["messages"]),
            observations=list(self.observations),
            info=info,
        )
        return True
