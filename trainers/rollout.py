"""Many token-level episodes at once, for the GRPO trainer.

Each episode is a :class:`~bat_gym.integrations.TokenEpisode`: the exact ids the
policy was conditioned on and sampled, tool replies appended as chat-template deltas
with mask 0 (token in, token out; the same bookkeeping every trainer adapter uses).

Episodes run in threads, each on its own env from a pool; their generation requests
meet in a :class:`~bat_gym.policies.batching.MicroBatcher`, so the model decodes them
in batches while a slow tool call holds up only its own episode.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bat_gym.integrations._episode import EpisodeResult, TokenEpisode
from bat_gym.policies.batching import MicroBatcher
from bat_gym.policies.local import TokenGeneration

__all__ = ["RolloutWorkers", "GenerateBatch"]

#: Continues each prompt (token ids) with one assistant turn of at most ``max_new_tokens``.
GenerateBatch = Callable[[list[list[int]], int], Sequence[TokenGeneration]]


class RolloutWorkers:
    """A pool of envs that plays many token-level episodes concurrently.

    Args:
        make_env: builds one env (called lazily, at most ``num_envs`` times).
        generate_batch: continues a batch of token sequences, e.g.
            ``lambda p, n: policy.generate_tokens(p, max_new_tokens=n)``.
        tokenizer: the policy's tokenizer (its chat template renders prompts and replies).
        max_new_tokens: tokens per assistant turn.
        num_envs: episodes played at once (one env, one sandbox each).
        max_batch_size: the most sequences one generation call gets.
        wait_s: how long generation waits for more episodes to join a batch.
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        generate_batch: GenerateBatch,
        tokenizer: Any,
        *,
        max_new_tokens: int,
        num_envs: int = 8,
        max_batch_size: int = 32,
        wait_s: float = 0.005,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.make_env = make_env
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.num_envs = num_envs
        self.batcher: MicroBatcher[list[int], TokenGeneration] = MicroBatcher(
            lambda prompts: list(generate_batch(prompts, max_new_tokens)),
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

    def play_one(self, state_id: str) -> EpisodeResult:
        """One episode from ``state_id`` on a pooled env."""
        env = self._acquire()
        try:
            episode = TokenEpisode(env, self.tokenizer, max_new_tokens_per_turn=self.max_new_tokens)
            episode.reset(state_id)
            while not episode.done:
                sample = self.batcher(episode.context_ids)
                episode.advance(sample.token_ids, sample.logprobs)
            return episode.result()
        finally:
            self._release(env)

    def play(self, state_ids: Sequence[str]) -> list[EpisodeResult]:
        """One episode per state id (repeat an id for a GRPO group); results in order."""
        with ThreadPoolExecutor(self.num_envs, thread_name_prefix="bat-rollout") as pool:
            return list(pool.map(self.play_one, state_ids))

    def close(self) -> None:
        """Stop generation and close every env."""
        self.batcher.close()
        for env in self._all:
            env.close()
        self._all.clear()
        self._free.clear()
