r"""TokenEpisode: one bat_gym episode as the token sequence a trainer learns from.

Every trainer adapter shares this bookkeeping, so prompts, tool results, masks and
rewards cannot drift between frameworks. The env stays the only source of prompts,
tool semantics and rewards; the episode is played by the one loop
(:func:`bat_gym.rollout.loop.episode_loop`), and this class is its token hooks:

* the prompt is the env's conversation (``info["messages"]``, ``info["tools"]``)
  rendered by the tokenizer's chat template with the generation prompt;
* a turn's sampled tokens are appended as they are (token in, token out), with
  ``response_mask`` 1, and their text is the env's action;
* the env's reply is appended with ``response_mask`` 0, as the chat-template delta
  between the conversation with and without the new messages
  (:func:`~bat_gym.rollout.chat_tokens.reply_delta`, which also says what ends a turn
  and how templates that re-render earlier turns are handled).

Formally, with ``g_t`` the tokens sampled at turn ``t`` and ``o_t`` the reply's tokens::

    response_ids  = g_1 + o_1 + g_2 + o_2 + ... + g_T
    response_mask = [1]*|g_1| + [0]*|o_1| + ... + [1]*|g_T|

and turn ``t`` is sampled from exactly ``prompt_ids + g_1 + o_1 + ... + o_{t-1}``.
The last reply (e.g. ``finish``'s "Finished.") is not appended: nothing is generated
after it. The reward is the env's final-step reward (the rubric verdict under
:class:`~bat_gym.rubrics.verifier.reward.RubricReward`).

**Token limits.** An episode ends with ``stop_reason == "length"`` when a token limit
leaves no room for another turn, and ``EpisodeResult.length_limit`` says which:

* ``"turn"``: the sampler returned a turn without a stop token (``max_new_tokens`` per
  turn ran out). By default (``cut_turn="end"``) the cut turn is not acted on: its
  text is an unfinished message, and continuing would need an end-of-turn token the
  model did not sample, so the episode ends there and is scored as it stands.
  ``cut_turn="act"`` closes the turn with the template's end-of-turn token (mask 0)
  and steps the env with the cut text, which usually answers with a tool-call error;
* ``"response"``: ``max_response_tokens`` (sampled plus reply tokens) is spent;
* ``"total"``: ``max_total_tokens`` (prompt plus response, the model's context) is spent.

A ``length`` episode is scored as it stands (the rubric on the workspace), as the env
does when one of its own budgets truncates the episode (``"truncated"``).

>>> episode = TokenEpisode(env, tokenizer, max_response_tokens=4096)  # doctest: +SKIP
>>> result = episode.run(lambda context_ids, max_new: sample(context_ids, max_new))  # doctest: +SKIP
>>> result.reward, sum(result.response_mask)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

from bat_gym.core.completion import Completion
from bat_gym.core.errors import BatGymError, ConfigError
from bat_gym.rollout.chat_tokens import (
    RERENDERED_TEMPLATE,
    ChatTemplateError,
    default_stop_token_ids,
    end_of_turn_id,
    render_ids,
    reply_delta,
)
from bat_gym.rollout.loop import Rollout, Step, TurnHooks, advance, episode_loop, reset_info

__all__ = [
    "AsyncGenerate",
    "BatchGenerate",
    "CutTurn",
    "EpisodeResult",
    "Generate",
    "LengthLimit",
    "PromptTooLong",
    "Rerendering",
    "StopReason",
    "TokenEpisode",
    "play_in_lockstep",
    "rubric_wrapper",
]

log = logging.getLogger(__name__)

StopReason = Literal["terminated", "truncated", "length"]
"""Why an episode ended: the policy called ``finish``; an env budget ran out; or a token
limit of the episode left no room for another turn (see :data:`LengthLimit`)."""

LengthLimit = Literal["turn", "response", "total"]
"""The token limit that ended a ``length`` episode: a turn cut by the sampler's
per-turn limit (no stop token), ``max_response_tokens``, or ``max_total_tokens``."""

CutTurn = Literal["end", "act"]
"""What a turn cut before its stop token does: end the episode (``length``), or close
the turn and step the env with its text."""

Rerendering = Literal["follow_sampled", "error"]
"""What a template that re-renders earlier turns does: keep the sampled tokens and take
the reply from the template (see the module doc), or raise :class:`ChatTemplateError`."""

Generate = Callable[[list[int], int | None], Sequence[int]]
"""``generate(context_ids, max_new_tokens) -> sampled token ids`` (None: no limit)."""

BatchGenerate = Callable[[list[list[int]], list[int | None]], Sequence[Sequence[int]]]
"""``generate(contexts, max_new_tokens) -> one turn's sampled ids per context``."""

AsyncGenerate = Callable[
    [list[int], int | None], Awaitable[tuple[Sequence[int], Sequence[float] | None]]
]
"""``await generate(context_ids, max_new_tokens) -> (token_ids, logprobs or None)``."""


class PromptTooLong(BatGymError, ValueError):
    """A state's prompt alone is longer than ``max_total_tokens`` (the model's context).

    Such an episode can be neither sampled nor trained on: the model never sees a
    sequence that long. Attributes: ``state_id``, ``prompt_tokens``, ``max_total_tokens``.
    """

    def __init__(self, state_id: str | None, prompt_tokens: int, max_total_tokens: int) -> None:
        self.state_id, self.prompt_tokens = state_id, prompt_tokens
        self.max_total_tokens = max_total_tokens
        super().__init__(
            f"the prompt of state {state_id or '(unnamed)'} is {prompt_tokens} tokens, longer "
            f"than the {max_total_tokens} the model takes (max_total_tokens, by default its "
            "max_position_embeddings): use a model with a longer context, or states with "
            "shorter prompts (an earlier focus, fewer turns of history)"
        )


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
        num_turns: assistant turns generated (those the env stepped, plus a last turn
            a token limit cut).
        num_replies: env replies appended to ``response_ids``.
        stop_reason: why the episode ended.
        messages: the env's conversation at the end (OpenAI chat format).
        observations: the env's reply text to each stepped turn, in order (``obs``
            of ``step``), the last one included.
        info: the env's last ``info``.
        length_limit: for ``stop_reason == "length"``, the limit that ended it
            (``"turn"``, ``"response"`` or ``"total"``); None otherwise.
        rerendered_replies: replies taken from a template that re-renders earlier
            turns (see the module doc); 0 for a prefix-preserving template.
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
    length_limit: LengthLimit | None = None
    rerendered_replies: int = 0

    @property
    def reward_or_none(self) -> float | None:
        """The reward, or None when the verdict is null (drop the rollout, don't score 0)."""
        if self.verdict is not None and self.verdict.reward is None:
            return None
        return self.reward


def rubric_wrapper(env: gym.Env[str, str]) -> Any:
    """The :class:`~bat_gym.rubrics.verifier.reward.RubricReward` in ``env``'s wrapper stack, or None."""
    from bat_gym.rubrics.verifier.reward import RubricReward

    while True:
        if isinstance(env, RubricReward):
            return env
        inner = getattr(env, "env", None)
        if inner is None:
            return None
        env = inner


class TokenEpisode(TurnHooks):
    """One bat_gym env played on token ids: the token hooks of the one episode loop.

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
        max_total_tokens: cap on ``prompt_ids + response_ids`` (the model's context
            length, e.g. vLLM's ``max_model_len``); the episode ends ``length`` before a
            turn or reply would exceed it. None: no cap.
        stop_token_ids: the tokens the sampler stops at (``policy.stop_token_ids``); a
            turn ending in one is complete. Default: :func:`default_stop_token_ids`.
        chat_template_kwargs: extra arguments of ``apply_chat_template`` (e.g.
            ``{"enable_thinking": False}``).
        cut_turn: what a turn that ends without a stop token does (see the module doc):
            ``"end"`` the episode, or ``"act"`` on its text.
        rerendering: what a template that re-renders earlier turns does (see
            :mod:`~bat_gym.rollout.chat_tokens`): ``"follow_sampled"`` or ``"error"``.
        on_restart: a tool call that crashed and restarted the sandbox: ``"ignore"``
            (the episode goes on) or ``"raise"``
            :class:`~bat_gym.rollout.loop.SandboxRestarted`, for a runner that plays
            the episode again.
    """

    def __init__(
        self,
        env: gym.Env[str, str],
        tokenizer: Any,
        *,
        max_response_tokens: int | None = None,
        max_new_tokens_per_turn: int | None = None,
        max_total_tokens: int | None = None,
        stop_token_ids: Collection[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        cut_turn: CutTurn = "end",
        rerendering: Rerendering = "follow_sampled",
        on_restart: str = "ignore",
    ) -> None:
        for name, value in (
            ("max_response_tokens", max_response_tokens),
            ("max_new_tokens_per_turn", max_new_tokens_per_turn),
            ("max_total_tokens", max_total_tokens),
        ):
            # A budget of 0 could never hold a turn: the episode would end unplayed.
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of tokens or None, got {value}")
        if cut_turn not in ("end", "act"):
            raise ConfigError(f"cut_turn must be 'end' or 'act', got {cut_turn!r}")
        if on_restart not in ("raise", "ignore"):
            raise ConfigError(f"on_restart must be 'raise' or 'ignore', got {on_restart!r}")
        if rerendering not in ("follow_sampled", "error"):
            raise ConfigError(
                f"rerendering must be 'follow_sampled' or 'error', got {rerendering!r}"
            )
        self.env = env
        self.tokenizer = tokenizer
        self.max_response_tokens = max_response_tokens
        self.max_new_tokens_per_turn = max_new_tokens_per_turn
        self.max_total_tokens = max_total_tokens
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if stop_token_ids is None:
            stop_token_ids = default_stop_token_ids(tokenizer, self.chat_template_kwargs)
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        if not self.stop_token_ids:
            raise ConfigError(
                "no stop token: the tokenizer has no eos_token_id and its chat template no "
                "end-of-turn token; pass the sampler's stop_token_ids"
            )
        self._first_stop = next(iter(int(t) for t in stop_token_ids))
        self.cut_turn: CutTurn = cut_turn
        self.rerendering: Rerendering = rerendering
        self._close: int | None = None
        self.on_restart = on_restart
        self._loop: Generator[Any, Any, Rollout] | None = None
        self._stopped = True  # whether the last sampled turn ended in a stop token
        self._info: dict[str, Any] = {}
        self._result: EpisodeResult | None = None
        self._tools: list[dict[str, Any]] = []
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self._logprobs: list[float] | None = []
        self.observations: list[str] = []
        self.num_turns = self.num_replies = self.rerendered_replies = 0

    # -- playing -------------------------------------------------------------------------

    def reset(self, state_id: str | None = None, *, seed: int | None = None) -> list[int]:
        """Reset the env (to ``state_id`` when given) and return the prompt ids."""
        return self.begin(reset_info(self.env, state_id, seed=seed))

    def begin(self, info: dict[str, Any]) -> list[int]:
        """Start from an env that was just reset, given the ``info`` its reset returned.

        A prompt that leaves no room under ``max_total_tokens`` ends the episode at once
        (``length``, limit ``"total"``), scored as the state stands.

        Raises:
            PromptTooLong: the prompt alone is longer than ``max_total_tokens``.
        """
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
        self.num_turns = self.num_replies = self.rerendered_replies = 0
        self._result = None
        if self.max_total_tokens is not None and len(self.prompt_ids) > self.max_total_tokens:
            raise PromptTooLong(info.get("state_id"), len(self.prompt_ids), self.max_total_tokens)
        room = self.remaining_tokens
        if room is not None and room < 1:
            self._finish("length", info, None, self._binding_limit())
        self._loop = episode_loop(self.env, self, info, on_restart=self.on_restart)
        advance(self._loop)
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
        """Room left under ``max_response_tokens`` and ``max_total_tokens`` (None: no limit)."""
        rooms = [r for r in self._rooms() if r is not None]
        return min(rooms) if rooms else None

    @property
    def max_new_tokens(self) -> int | None:
        """The most tokens the next turn may sample (None: no limit)."""
        caps = [c for c in (self.remaining_tokens, self.max_new_tokens_per_turn) if c is not None]
        return min(caps) if caps else None

    def advance(self, token_ids: Sequence[int], logprobs: Sequence[float] | None = None) -> bool:
        """Play one turn: append its sampled tokens, step the env with their text, append its reply.

        Args:
            token_ids: the tokens sampled for this turn (a stop token at the end, if any,
                included).
            logprobs: their log-probabilities, same length; None if unknown.

        Returns:
            Whether the episode has ended.

        Raises:
            ChatTemplateError: the template's reply cannot be placed after the sampled
                tokens (see :func:`~bat_gym.rollout.chat_tokens.reply_delta`), or it
                re-renders earlier turns and ``rerendering="error"``.
            SandboxRestarted: the step's tool call crashed the sandbox and
                ``on_restart="raise"``.
        """
        if self._loop is None or self._result is not None:
            raise RuntimeError("advance() needs a started, unfinished episode: call reset() first")
        tokens = [int(t) for t in token_ids]
        if logprobs is not None and len(logprobs) != len(tokens):
            raise ValueError(
                f"expected one logprob per sampled token ({len(tokens)}), got {len(logprobs)}"
            )
        advance(self._loop, (tokens, logprobs))
        return self.done

    def run(self, generate: Generate, *, state_id: str | None = None) -> EpisodeResult:
        """Play one episode with ``generate(context_ids, max_new_tokens) -> token ids``.

        Resets the env to ``state_id`` first, unless an episode was already begun.
        """
        if self._loop is None or self._result is not None:
            self.reset(state_id)
        while not self.done:
            self.advance(generate(self.context_ids, self.max_new_tokens))
        return self.result()

    async def arun(self, generate: AsyncGenerate, *, state_id: str) -> EpisodeResult:
        """:meth:`run` on an event loop, with ``await generate(...) -> (ids, logprobs)``.

        The env's reset and steps run in the default executor: they block on the
        sandbox, and the event loop serves the other episodes' generations meanwhile.
        """
        run = asyncio.get_running_loop().run_in_executor
        await run(None, self.reset, state_id)
        while not self.done:
            tokens, logprobs = await generate(self.context_ids, self.max_new_tokens)
            await run(None, self.advance, list(tokens), logprobs)
        return self.result()

    def result(self) -> EpisodeResult:
        """The finished episode."""
        if self._result is None:
            raise RuntimeError("the episode has not ended yet; call advance() until done")
        return self._result

    # -- the loop's hooks ----------------------------------------------------------------

    def request(self, info: dict[str, Any]) -> TokenEpisode | None:
        """The episode itself (read :attr:`context_ids`, :attr:`max_new_tokens`); None: done."""
        return None if self.done else self

    def action(self, reply: tuple[list[int], Sequence[float] | None]) -> Completion | None:
        """Append a turn's sampled tokens; the message to step with, or None if a limit cut it."""
        tokens, logprobs = reply
        room = self.remaining_tokens
        self._stopped = bool(tokens) and tokens[-1] in self.stop_token_ids
        # A turn the budget cut is not a complete message: keep its tokens (the model
        # sampled them) but do not act on it.
        if room is not None and (len(tokens) > room or (len(tokens) == room and not self._stopped)):
            limit = self._binding_limit()
            self._append(tokens[:room], 1, None if logprobs is None else list(logprobs)[:room])
            self.num_turns += 1
            self._finish("length", self._info, None, limit)
            return None
        if not self._stopped:
            self._check_unstopped(tokens)
        self._append(tokens, 1, logprobs)
        self.num_turns += 1
        if not self._stopped and self.cut_turn == "end":
            self._finish("length", self._info, None, "turn")
            return None
        return Completion(self._action_text(tokens), num_tokens=len(tokens))

    def observe(self, step: Step) -> bool:
        """Append the env's reply to a stepped turn; True when the episode ended."""
        before = self._info["messages"]
        self._info = info = step.info
        self.observations.append(step.observation)
        if step.done:
            return self._finish("terminated" if step.terminated else "truncated", info, step.reward)
        messages = info["messages"]
        delta = reply_delta(
            self.tokenizer,
            messages[: len(before) + 1],  # the conversation up to the new assistant turn
            messages[len(before) + 1 :],
            self._tools,
            stop_token_ids=self.stop_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        if delta.rerendered:
            if self.rerendering == "error":
                raise ChatTemplateError(RERENDERED_TEMPLATE)
            self.rerendered_replies += 1
        reply = delta.ids
        if not self._stopped:
            # cut_turn="act": the turn ended without its end-of-turn token (a per-turn
            # cap); close it here so the context stays well formed. The model did not
            # sample it, so it is a reply token (mask 0).
            reply = [self._close_token(), *reply]
        room = self.remaining_tokens
        if room is not None and len(reply) >= room:
            # No room for the reply and one more sampled token.
            return self._finish("length", info, None, self._binding_limit())
        self._append(reply, 0, None)
        self.num_replies += 1
        return False

    # -- helpers -------------------------------------------------------------------------

    def _rooms(self) -> tuple[int | None, int | None]:
        """Room under ``max_response_tokens`` and under ``max_total_tokens``."""
        response = (
            None
            if self.max_response_tokens is None
            else self.max_response_tokens - len(self.response_ids)
        )
        total = (
            None
            if self.max_total_tokens is None
            else self.max_total_tokens - len(self.prompt_ids) - len(self.response_ids)
        )
        return response, total

    def _binding_limit(self) -> LengthLimit:
        """The budget with the least room (``max_total_tokens`` on a tie)."""
        response, total = self._rooms()
        if total is not None and (response is None or total <= response):
            return "total"
        return "response"

    def _check_unstopped(self, tokens: list[int]) -> None:
        cap = self.max_new_tokens
        if cap is not None and len(tokens) < cap:
            # Shorter than every limit and yet no stop token: the sampler stopped at a
            # token this episode does not know, and every turn would look cut.
            log.warning(
                "a turn of %d tokens ended without any of the stop tokens %s before its "
                "limit of %d; pass the sampler's own stop_token_ids to TokenEpisode",
                len(tokens),
                sorted(self.stop_token_ids),
                cap,
            )

    def _close_token(self) -> int:
        """The token that closes a turn the sampler left open: the template's end of turn."""
        if self._close is None:
            eot = end_of_turn_id(self.tokenizer, self.chat_template_kwargs)
            self._close = eot if eot in self.stop_token_ids else self._first_stop
        return self._close

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

    def _finish(
        self,
        reason: StopReason,
        info: dict[str, Any],
        reward: float | None,
        limit: LengthLimit | None = None,
    ) -> bool:
        verdict = info.get("verdict")
        if reward is None:
            # Cut by a token limit mid-episode: score the workspace as it stands,
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
            length_limit=limit if reason == "length" else None,
            rerendered_replies=self.rerendered_replies,
        )
        return True


def play_in_lockstep(
    episodes: Sequence[TokenEpisode], generate: BatchGenerate
) -> list[EpisodeResult]:
    """Play begun episodes to their ends, each turn sampling the unfinished ones as one batch.

    Args:
        episodes: episodes after :meth:`TokenEpisode.begin` (or ``reset``).
        generate: continues each context (token ids) with one turn of at most its
            ``max_new_tokens`` (None: no limit).

    Returns:
        The episodes' results, in the order of ``episodes``.
    """
    while active := [e for e in episodes if not e.done]:
        turns = generate([e.context_ids for e in active], [e.max_new_tokens for e in active])
        for episode, tokens in zip(active, turns, strict=True):
            episode.advance(tokens)
    return [e.result() for e in episodes]
