"""Multi-turn rollouts at the token level: the exact ids the policy saw and sampled.

One episode is a single growing token sequence::

    [prompt ids] [sampled turn 1] [observation 1] [sampled turn 2] [observation 2] ...
                  mask 1           mask 0          mask 1           mask 0

The prompt is the env's opening conversation through the chat template. After each
step, the tool results enter as the *template delta*: the text the chat template adds
when the env's new messages are appended, tokenized on its own and appended to the
sequence. The sequence is never re-rendered or re-tokenized from messages, so the ids
trained on are exactly the ids the policy was conditioned on and sampled
(token-in/token-out: no drift from a template that renders a tool call differently
from how the model wrote it).

Episodes run concurrently in threads, each on its own env; their generation requests
meet in a :class:`~bat_gym.policies.batching.MicroBatcher`, so the model decodes them
in batches while a slow tool call holds up only its own episode.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bat_gym.env import Completion
from bat_gym.policies.batching import MicroBatcher
from bat_gym.policies.transformers_policy import TokenGeneration

__all__ = ["Rollout", "TemplateDelta", "play_token_episode", "RolloutWorkers"]


#: Continues one prompt (token ids) with one assistant turn.
Generate = Callable[[list[int]], TokenGeneration]


@dataclass
class Rollout:
    """One finished episode as a training sequence.

    Attributes:
        state_id: the state it started from (the GRPO group key).
        prompt_ids: the opening prompt, shape ``(P,)``.
        completion_ids: everything after it, sampled and observation tokens, ``(C,)``.
        loss_mask: 1 on sampled tokens, 0 on observation tokens, ``(C,)``.
        sample_logprobs: the sampler's log-probability of each sampled token, 0.0 on
            observation tokens, ``(C,)``.
        reward: the rubric reward (None: the verdict was null; drop the rollout).
        turns: assistant turns taken.
        finished: the policy called ``finish``.
        stage_scores: the verdict's stage credits.
    """

    state_id: str
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    sample_logprobs: list[float] = field(default_factory=list)
    reward: float | None = None
    turns: int = 0
    finished: bool = False
    stage_scores: dict[str, float | None] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        """How many tokens the policy sampled."""
        return sum(self.loss_mask)


class TemplateDelta:
    """Renders conversations with a tokenizer's chat template and takes differences.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: the tool schemas passed to the template (``info["tools"]``).
    """

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]]) -> None:
        from bat_gym.policies.transformers_policy import chat_messages

        self.tokenizer = tokenizer
        self.tools = list(tools) or None
        self._chat = chat_messages
        eos = tokenizer.eos_token
        if not eos:
            raise ValueError("the tokenizer has no eos token; set tokenizer.eos_token")
        self.eos = eos

    def render(self, messages: Sequence[dict[str, Any]], *, generation_prompt: bool) -> str:
        """The conversation as the template writes it."""
        return self.tokenizer.apply_chat_template(
            self._chat(messages),
            tools=self.tools,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens the template wrote are kept as such."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The opening prompt: the env's first messages and the generation prompt."""
        return self.encode(self.render(messages, generation_prompt=True))

    def observation(
        self,
        before: Sequence[dict[str, Any]],
        after: Sequence[dict[str, Any]],
        sample: TokenGeneration,
    ) -> list[int]:
        """The tokens that follow a sampled turn: its end, the new messages, the next prompt.

        ``before`` is the conversation up to and including the assistant message the
        env recorded for the turn; ``after`` adds the env's new messages. The delta
        text is ``render(after, prompt) - render(before)``, prefixed by whatever the
        template writes after an assistant turn's end-of-turn token (ChatML: a
        newline). A turn cut by the length limit gets its end-of-turn token here, as
        an observation token: the model did not sample it.

        Raises:
            ValueError: the template does not render ``before`` as a prefix of
                ``after`` (it rewrites history), so there is no delta.
        """
        head = self.render(before, generation_prompt=False)
        full = self.render(after, generation_prompt=True)
        if not full.startswith(head):
            raise ValueError(
                "the chat template renders an earlier conversation differently once new "
                "messages follow, so tool results cannot be appended as tokens; use a "
                "template whose renderings of growing conversations are prefixes"
            )
        cut = head.rfind(self.eos)
        if cut < 0:
            raise ValueError(f"the chat template does not end turns with {self.eos!r}")
        after_eos = head[cut + len(self.eos) :]
        ended = sample.finish_reason == "stop"
        return self.encode(("" if ended else self.eos) + after_eos + full[len(head) :])


def play_token_episode(
    env: Any,
    generate: Generate,
    delta: TemplateDelta,
    *,
    state_id: str,
) -> Rollout:
    """Play one episode from ``state_id`` with token-level generation.

    Args:
        env: a rubric-wrapped bat_gym env (any wrapper stack over a StageEnv).
        generate: continues a token sequence with one assistant turn.
        delta: the chat-template renderer of the policy's tokenizer.
        state_id: the state to reset to.
    """
    _, info = env.reset(options={"state_id": state_id})
    ids = delta.prompt(info["messages"])
    rollout = Rollout(state_id=state_id, prompt_ids=list(ids))
    while True:
        sample = generate(ids)
        text = delta.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        before_count = len(info["messages"])
        _, reward, terminated, truncated, info = env.step(Completion(text, len(sample.token_ids)))
        rollout.turns += 1
        rollout.completion_ids += sample.token_ids
        rollout.loss_mask += [1] * len(sample.token_ids)
        rollout.sample_logprobs += list(sample.logprobs)
        ids = ids + sample.token_ids
        if terminated or truncated:
            verdict = info.get("verdict")
            rollout.reward = None if verdict is None or verdict.reward is None else float(reward)
            rollout.finished = bool(terminated)
            if verdict is not None:
                rollout.stage_scores = {s.stage: s.credit for s in verdict.stages}
            return rollout
        messages = info["messages"]
        # The assistant message the env recorded is the first new one.
        obs = delta.observation(messages[: before_count + 1], messages, sample)
        rollout.completion_ids += obs
        rollout.loss_mask += [0] * len(obs)
        rollout.sample_logprobs += [0.0] * len(obs)
        ids = ids + obs


class RolloutWorkers:
    """A pool of envs that plays many token-level episodes at once.

    Args:
        make_env: builds one env (called lazily, at most ``num_envs`` times).
        generate_batch: continues a batch of token sequences (e.g.
            ``TransformersPolicy.generate_tokens``), one :class:`TokenGeneration` each.
        delta: the chat-template renderer.
        num_envs: episodes played at once (one env, one sandbox each).
        max_batch_size: the most sequences one generation call gets.
        wait_s: how long generation waits for more episodes to join a batch.
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        generate_batch: Callable[[list[list[int]]], Sequence[TokenGeneration]],
        delta: TemplateDelta,
        *,
        num_envs: int = 8,
        max_batch_size: int = 32,
        wait_s: float = 0.005,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.make_env = make_env
        self.delta = delta
        self.num_envs = num_envs
        self.batcher: MicroBatcher[list[int], TokenGeneration] = MicroBatcher(
            lambda prompts: list(generate_batch(prompts)),
            max_batch_size=max_batch_size,
            wait_s=wait_s,
            name="bat-gym-rollout-generate",
        )
        self._free: list[Any] = []
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def _acquire(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
        env = self.make_env()
        with self._lock:
            self._all.append(env)
        return env

    def _release(self, env: Any) -> None:
        with self._lock:
            self._free.append(env)

    def play(self, state_ids: Sequence[str]) -> list[Rollout]:
        """One episode per state id (repeat an id for a GRPO group); results in order."""

        def one(state_id: str) -> Rollout:
            env = self._acquire()
            try:
                return play_token_episode(env, self.batcher, self.delta, state_id=state_id)
            finally:
                self._release(env)

        with ThreadPoolExecutor(self.num_envs, thread_name_prefix="bat-rollout") as pool:
            return list(pool.map(one, state_ids))

    def close(self) -> None:
        """Stop generation and close every env."""
        self.batcher.close()
        for env in self._all:
            env.close()
        self._all.clear()
        self._free.clear()
