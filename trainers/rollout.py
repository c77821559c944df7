"""Many token-level episodes at once, for the GRPO trainer.

Each episode is a :class:`~bat_gym.rollout.TokenEpisode`: the exact ids the
policy was conditioned on and sampled, tool replies appended as chat-template deltas
with mask 0 (token in, token out; the same bookkeeping every trainer adapter uses).

Episodes run in threads, each on its own env from a :class:`~bat_gym.rollout.Runner`
(whose retry rule plays an episode again when its env is lost, its sandbox crashed or
its policy backend failed); their generation requests
meet in a :class:`~bat_gym.policies.batching.MicroBatcher`, so the model decodes them
in batches while a slow tool call holds up only its own episode.

An episode played with a *seed key* (``play(ids, seed_keys=...)``) asks for turn ``t``
with the key ``(*seed_key, t)``, and a seeded policy samples it from
:func:`~bat_gym.policies.keyed_seed` of its seed and that key: the episode draws the same
tokens whatever else is in its batch and whichever episode's turn arrives first.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from bat_gym.policies.base import SeedKey
from bat_gym.policies.batching import MicroBatcher
from bat_gym.policies.local import TokenGeneration
from bat_gym.rollout.chat_tokens import default_stop_token_ids
from bat_gym.rollout.runner import Runner
from bat_gym.rollout.token_episode import CutTurn, EpisodeResult, Rerendering, TokenEpisode

__all__ = [
    "LOST_ENV_ATTEMPTS",
    "GenerateBatch",
    "GenerationRequest",
    "RolloutWorkers",
    "call_generate",
    "cut",
    "turn_key",
]

# Plays of one episode when its env is lost (a Ray actor or node died), its sandbox
# crashed or its policy backend failed, before the GRPO step gives up.
LOST_ENV_ATTEMPTS = 3

#: Continues each prompt (token ids) with one assistant turn of at most ``max_new_tokens``.
#: Episodes played with seed keys call it with a third, keyword argument ``seed_keys``:
#: one key per prompt (None for an unkeyed one), as ``policy.generate_tokens`` takes it.
GenerateBatch = Callable[..., Sequence[TokenGeneration]]

#: One generation request: the episode's context ids, its token cap and its turn's key.
GenerationRequest = tuple[list[int], int, SeedKey | None]


class RolloutWorkers:
    """A pool of envs that plays many token-level episodes concurrently.

    Args:
        make_env: builds one env (called lazily, once per slot of ``num_envs``, and
            again for a slot whose env broke).
        generate_batch: continues a batch of token sequences, e.g.
            ``lambda p, n, **kw: policy.generate_tokens(p, max_new_tokens=n, **kw)``;
            it is passed ``seed_keys=`` only for batches with a keyed episode in them.
        tokenizer: the policy's tokenizer (its chat template renders prompts and replies).
        max_new_tokens: tokens per assistant turn.
        num_envs: episodes played at once (one env, one sandbox each).
        max_batch_size: the most sequences one generation call gets.
        wait_s: how long generation waits for more episodes to join a batch.
        stop_token_ids: the tokens ``generate_batch`` stops at (``policy.stop_token_ids``),
            so that episodes know a finished turn from a cut one; default: the chat
            template's end-of-turn token and the tokenizer's eos
            (:func:`~bat_gym.rollout.chat_tokens.default_stop_token_ids`).
        chat_template_kwargs: extra ``apply_chat_template`` arguments (e.g.
            ``{"enable_thinking": False}``), the same the policy renders prompts with.
        max_total_tokens: cap on prompt plus response tokens of an episode (None: none).
        cut_turn: what a turn cut by ``max_new_tokens`` does (see
            :class:`~bat_gym.rollout.TokenEpisode`): ``"end"`` the episode or
            ``"act"`` on it.
        rerendering: what a chat template that re-renders earlier turns does:
            ``"follow_sampled"`` or ``"error"``.
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
        stop_token_ids: Collection[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_total_tokens: int | None = None,
        cut_turn: CutTurn = "end",
        rerendering: Rerendering = "follow_sampled",
    ) -> None:
        # Checks num_envs (>= 1) before anything starts.
        self.runner = Runner(
            make_env, workers=num_envs, max_attempts=LOST_ENV_ATTEMPTS, name="bat-rollout"
        )
        self.make_env = make_env
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.num_envs = num_envs
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.stop_token_ids = (
            list(stop_token_ids)
            if stop_token_ids is not None
            else default_stop_token_ids(tokenizer, self.chat_template_kwargs)
        )
        self.max_total_tokens = max_total_tokens
        self.cut_turn: CutTurn = cut_turn
        self.rerendering: Rerendering = rerendering
        self._generate_batch = generate_batch
        self.batcher: MicroBatcher[GenerationRequest, TokenGeneration] = MicroBatcher(
            self._generate,
            max_batch_size=max_batch_size,
            wait_s=wait_s,
            name="bat-gym-rollout-generate",
        )

    def _generate(self, requests: list[GenerationRequest]) -> list[TokenGeneration]:
        """One call for the batch at its largest cap; each turn is then cut to its own.

        The first ``k`` tokens of a sample are a sample with limit ``k`` (decoding is
        autoregressive), so one call serves episodes with less room left.
        """
        return [
            cut(gen, n)
            for gen, (_, n, _) in zip(
                call_generate(self._generate_batch, requests), requests, strict=True
            )
        ]

    def _sample(self, request: GenerationRequest) -> tuple[TokenGeneration, int | None]:
        """One turn from the batcher, and the version of the weights that sampled it (None)."""
        return self.batcher(request), None

    def _result(self, result: EpisodeResult, turn_starts: list[tuple[int, int | None]]) -> Any:
        """What :meth:`play_one` returns for a finished episode (here: the episode itself).

        Args:
            result: the episode.
            turn_starts: per turn, where its tokens begin in ``result.response_ids`` and
                the version that sampled it.
        """
        return result

    def episode(self, env: Any) -> TokenEpisode:
        """A :class:`~bat_gym.rollout.TokenEpisode` on ``env`` with these settings.

        A tool call that crashes the sandbox raises
        :class:`~bat_gym.rollout.SandboxRestarted`, so the runner plays the episode again.
        """
        return TokenEpisode(
            env,
            self.tokenizer,
            max_new_tokens_per_turn=self.max_new_tokens,
            max_total_tokens=self.max_total_tokens,
            stop_token_ids=self.stop_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
            cut_turn=self.cut_turn,
            rerendering=self.rerendering,
            on_restart="raise",
        )

    def play_one(self, state_id: str, seed_key: SeedKey | None = None) -> EpisodeResult:
        """One episode from ``state_id`` on a pooled env.

        An episode whose env is lost (:class:`~bat_gym.core.errors.EnvLost`: a Ray actor or
        its node died), whose sandbox crashed, or whose policy backend failed is played
        again from the start by the runner's retry rule
        (:mod:`bat_gym.rollout.runner`), up to ``LOST_ENV_ATTEMPTS`` times in all (with
        the same ``seed_key``, so the same draws); it is never scored as the policy's
        failure.

        Args:
            state_id: the start state.
            seed_key: names the episode to a seeded policy (see the module doc); None:
                the policy's own sequence.
        """

        def play(env: Any) -> Any:
            episode = self.episode(env)
            episode.reset(state_id)
            return self._play(episode, seed_key)

        return self.runner.run(play, what=f"an episode from {state_id}")

    def _play(self, episode: TokenEpisode, seed_key: SeedKey | None = None) -> Any:
        """Sample turns into a reset ``episode`` until it is done; its :meth:`_result`."""
        starts: list[tuple[int, int | None]] = []
        while not episode.done:
            cap = episode.max_new_tokens or self.max_new_tokens
            sample, version = self._sample(
                (episode.context_ids, cap, turn_key(seed_key, len(starts)))
            )
            starts.append((len(episode.response_ids), version))
            episode.advance(sample.token_ids, sample.logprobs)
        return self._result(episode.result(), starts)

    def play(
        self, state_ids: Sequence[str], seed_keys: Sequence[SeedKey] | None = None
    ) -> list[EpisodeResult]:
        """One episode per state id (repeat an id for a GRPO group); results in order.

        Args:
            state_ids: the start states.
            seed_keys: one key per episode (see the module doc), e.g.
                ``("grpo", step, rank, i)``; None: the policy's own sequence.
        """
        keys = [None] * len(state_ids) if seed_keys is None else list(seed_keys)
        if len(keys) != len(state_ids):
            raise ValueError(f"got {len(keys)} seed keys for {len(state_ids)} episodes")
        return self.runner.map(
            lambda job: self.play_one(*job), list(zip(state_ids, keys, strict=True))
        )

    def close(self) -> None:
        """Stop generation and close every env."""
        self.batcher.close()
        self.runner.close()


def turn_key(seed_key: SeedKey | None, turn: int) -> SeedKey | None:
    """The key of an episode's ``turn``-th generation (0-based); None for an unkeyed one."""
    return None if seed_key is None else (*seed_key, turn)


def call_generate(generate_batch: GenerateBatch, requests: Sequence[GenerationRequest]) -> Any:
    """One ``generate_batch`` call for ``requests``, at their largest cap.

    ``seed_keys`` goes along only when a request has a key, so a generate function of
    the plain ``(prompts, max_new_tokens)`` form serves unkeyed episodes.
    """
    prompts = [context for context, _, _ in requests]
    cap = max(n for _, n, _ in requests)
    keys = [key for _, _, key in requests]
    if any(key is not None for key in keys):
        return generate_batch(prompts, cap, seed_keys=keys)
    return generate_batch(prompts, cap)


def cut(gen: TokenGeneration, n: int) -> TokenGeneration:
    """``gen`` cut to its first ``n`` tokens (ended by ``"length"`` if that cut it)."""
    if len(gen.token_ids) > n:
        return TokenGeneration(gen.token_ids[:n], gen.logprobs[:n], "length")
    return gen
