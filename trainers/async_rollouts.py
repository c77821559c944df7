"""Asynchronous GRPO rollouts: generation goes on while the trainer updates, at most K versions behind.

A *version* is the number of optimizer steps in a set of weights: the run starts at
version ``s0`` (0, or the step it resumed from), and step ``s`` trains at version
``s - 1`` and publishes version ``s``. The producer is ``num_envs`` episode slots
(threads, one env each); the trainer consumes whole batches::

    producer (num_envs slots)                    trainer (calls next_batch, publish)
    -------------------------                    -----------------------------------
    a free slot plays the next drawn episode;    batch <- next_batch(v)      (waits if none)
      when all are taken, it draws batch j       drop groups older than v - K  (counted)
      once version >= s0 + j - K:                update on the rest -> version v + 1
      states <- sampler.next(B), G each          publish(v + 1, weights)
    every turn is sampled with the newest
      weights published before its call
    queue <- batch j once all its episodes are
      played, in order, every token stamped

A slow episode holds up only its slot: the next batch's episodes start as the current
batch's last ones finish, as far as the bound allows.

Batch ``j`` (0-based) feeds step ``s0 + j + 1``, trained at version ``s0 + j``; it is
started no earlier than version ``s0 + j - K``, so its oldest token is at most ``K``
versions behind the weights it is trained against. ``K = 0`` is lockstep: batch ``j``
waits for the update before it (the synchronous trainer, with a second copy of the
weights). The trainer checks the bound again at the point of use
(:func:`fresh_groups`): a group with any token older than ``v - K`` is dropped whole
(its advantages are relative to its members) and counted, never trained on.

An episode may span a weight update (a *partial rollout*): each turn is sampled with the
weights current at its generation call, and :class:`VersionedRollout` keeps each token's
version next to the sampler's log-probs of it (the *behaviour* log-probs), which the loss
corrects for (:func:`~bat_gym.trainers.grpo_loss.behaviour_is_weights`).

Weights reach the generator only between generation calls: :meth:`VersionedGenerator.publish`
leaves a copy in a mailbox, and the generator's next call loads it (into a second
Hugging Face model, or into a vLLM engine through
:meth:`~bat_gym.policies.vllm_policy.VLLMPolicy.update_weights`) before sampling.

Resume: samples in flight (drawn, playing or queued) are not saved. A checkpoint stores
the state sampler as it stood before the first batch the trainer had not consumed
(:meth:`AsyncRollouts.resume_state`), so a resumed run draws those states again and
plays them with the checkpoint's weights. With a ``seed_key``, an episode's draws are
named by its step, rank and place in the batch, so the replayed ones draw what the lost
ones had (unkeyed, the generator's seed counter continues past the lost samples' seeds).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bat_gym.policies.base import SeedKey
from bat_gym.policies.local import TokenGeneration
from bat_gym.rollout import EpisodeResult
from bat_gym.trainers.rollout import (
    GenerateBatch,
    GenerationRequest,
    RolloutWorkers,
    call_generate,
    cut,
)

__all__ = [
    "AsyncBatch",
    "AsyncRollouts",
    "VersionedGenerator",
    "VersionedRollout",
    "VersionedWorkers",
    "fresh_groups",
    "token_versions",
]

log = logging.getLogger(__name__)

# ============================================================================ samples


@dataclass(frozen=True)
class VersionedRollout:
    """One episode and the policy version of each of its tokens.

    Attributes:
        rollout: the episode; its ``response_logprobs`` are the behaviour log-probs
            (what the sampler reported, under the weights of the token's version).
        token_versions: (R,) the version of the weights that sampled each token of
            ``rollout.response_ids``; an env reply carries its turn's version (it has
            loss mask 0 and is never trained on).
        pool: the pool its state was drawn from (for the per-pool reward metric).
    """

    rollout: EpisodeResult
    token_versions: list[int]
    pool: str = "fixed"

    @property
    def oldest_version(self) -> int | None:
        """The version of the oldest sampled token (None: the episode sampled none)."""
        sampled = [
            v for v, m in zip(self.token_versions, self.rollout.response_mask, strict=True) if m
        ]
        return min(sampled) if sampled else None


def token_versions(turn_starts: Sequence[tuple[int, int]], length: int) -> list[int]:
    """Each response token's version from where each turn began and its version.

    Args:
        turn_starts: ``(index in response_ids where the turn's tokens begin, version)``
            per turn, in order.
        length: ``len(response_ids)``, R.

    Returns:
        (R,) versions: a turn's sampled tokens and the env reply after them get the
        turn's version.

    Example:
        >>> token_versions([(0, 3), (4, 4)], 6)
        [3, 3, 3, 3, 4, 4]
    """
    out: list[int] = []
    for k, (start, version) in enumerate(turn_starts):
        end = turn_starts[k + 1][0] if k + 1 < len(turn_starts) else length
        out += [version] * max(0, min(end, length) - max(start, len(out)))
    if turn_starts and len(out) < length:  # defensive: tokens before the first turn
        out = [turn_starts[0][1]] * (length - len(out)) + out
    return out


def fresh_groups(
    groups: Sequence[Sequence[VersionedRollout]], version: int, max_staleness: int
) -> list[bool]:
    """Which groups may be trained at ``version``: none of their tokens older than ``version - K``.

    ``staleness = version - oldest_version``; a group is kept when every member's is at
    most ``max_staleness``. A member that sampled no token is judged by the rest.

    Args:
        groups: the rollouts of each group (one state, G episodes).
        version: the trainer's version (optimizer steps in its weights).
        max_staleness: K.

    Returns:
        One bool per group, True to train on it.
    """
    keep = []
    for group in groups:
        oldest = [v for r in group if (v := r.oldest_version) is not None]
        keep.append(all(version - v <= max_staleness for v in oldest))
    return keep


# ============================================================================ generator


class VersionedGenerator:
    """A generate function whose weights the trainer swaps between calls, by version.

    Args:
        generate: continues a batch of token sequences with one turn each
            (``lambda p, n: policy.generate_tokens(p, max_new_tokens=n)``).
        load_weights: loads a published state dict into the generator's weights; runs
            on the generating thread, between calls.
        version: the version of the weights ``generate`` starts with.

    Attributes:
        version: the version of the weights the last call sampled with.
        loads: weight loads so far (published versions the generator picked up).
    """

    def __init__(
        self,
        generate: GenerateBatch,
        load_weights: Callable[[Mapping[str, Any]], Any],
        *,
        version: int,
    ) -> None:
        self._generate = generate
        self._load = load_weights
        self.version = version
        self.loads = 0
        self._pending: tuple[int, Mapping[str, Any]] | None = None
        self._lock = threading.Lock()

    def publish(self, version: int, weights: Mapping[str, Any]) -> None:
        """Leave ``weights`` (a copy the trainer will not touch again) for the next call.

        A version published before the generator picked up the previous one replaces it:
        only the newest is ever loaded.
        """
        with self._lock:
            self._pending = (version, weights)

    def __call__(
        self, prompts: list[list[int]], max_new_tokens: int, **kwargs: Any
    ) -> tuple[list[TokenGeneration], int]:
        """Sample one turn per prompt with the newest published weights; also their version.

        ``kwargs`` (``seed_keys``) go to ``generate`` as they are.
        """
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._load(pending[1])
            self.version, self.loads = pending[0], self.loads + 1
        return list(self._generate(prompts, max_new_tokens, **kwargs)), self.version


class VersionedWorkers(RolloutWorkers):
    """:class:`~bat_gym.trainers.rollout.RolloutWorkers` that stamp every turn with its version.

    Takes a :class:`VersionedGenerator` in place of ``generate_batch``; the other
    arguments are those of :class:`~bat_gym.trainers.rollout.RolloutWorkers`.
    :meth:`play_one` (and so :meth:`play`) returns :class:`VersionedRollout` records:
    the same episodes, through the hooks :meth:`_sample` and :meth:`_result`.
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        generator: VersionedGenerator,
        tokenizer: Any,
        **kwargs: Any,
    ) -> None:
        self.generator = generator
        super().__init__(make_env, lambda p, n, **kw: generator(p, n, **kw)[0], tokenizer, **kwargs)

    def _generate(self, requests: list[GenerationRequest]) -> list[tuple[TokenGeneration, int]]:  # type: ignore[override]
        """As the base class's (one call at the largest cap, each cut to its own), plus the version."""
        gens, version = call_generate(self.generator, requests)
        return [(cut(gen, n), version) for gen, (_, n, _) in zip(gens, requests, strict=True)]

    def _sample(self, request: GenerationRequest) -> tuple[TokenGeneration, int | None]:
        return self.batcher(request)  # type: ignore[return-value]  # (turn, version) pairs

    def _result(
        self, result: EpisodeResult, turn_starts: list[tuple[int, int | None]]
    ) -> VersionedRollout:
        """The episode with each token stamped with the version that sampled it."""
        versions = token_versions(turn_starts, len(result.response_ids))  # type: ignore[arg-type]
        return VersionedRollout(result, versions)


# ============================================================================ producer/consumer


@dataclass(frozen=True)
class AsyncBatch:
    """What :meth:`AsyncRollouts.next_batch` hands the trainer for one step.

    Attributes:
        rollouts: the fresh groups' episodes, group by group (G consecutive per state).
        dropped_groups: groups left out because a token was more than K versions old.
        wait_s: seconds the trainer waited for the batch (its idle time).
        generator_idle_s: seconds without an episode in play (every slot waiting at the
            staleness bound) since the previous batch was handed over.
    """

    rollouts: list[VersionedRollout]
    dropped_groups: int
    wait_s: float
    generator_idle_s: float


@dataclass
class _Produced:
    """A drawn batch: its episodes (state id, pool) and their results as they come in."""

    index: int
    episodes: list[tuple[str, str]]
    results: list[VersionedRollout | None]
    started: int = 0  # episodes handed to a slot so far
    remaining: int = 0  # episodes not yet finished

    def groups(self, size: int) -> list[list[VersionedRollout]]:
        done = [r for r in self.results if r is not None]
        return [done[i : i + size] for i in range(0, len(done), size)]


class AsyncRollouts:
    """The producer's episode slots and the bounded hand-over between them and the trainer.

    Args:
        workers: plays the episodes, ``workers.num_envs`` at once (their generator is the
            one weights are published to).
        sampler: the run's state sampler (``next(n)`` -> ``SampledState`` rows, with
            ``state_dict``/``load_state_dict``); only the producer draws from it.
        groups_per_step: B, states per batch.
        group_size: G, episodes per state.
        max_staleness: K >= 0, the most versions a trained token may lag the trainer.
        version: the trainer's version when the run (or resume) starts.
        rank, world: this process's share of each batch's states (``[rank::world]``).
        seed_key: the prefix of every episode's seed key; episode ``i`` of batch ``j``
            on this rank is keyed ``(*seed_key, version + j, rank, i)``, the key the
            synchronous trainer gives episode ``i`` of that step. None: unkeyed.

    Use :meth:`start` once, then per step :meth:`next_batch` and, after the update,
    :meth:`publish`; :meth:`close` at the end.
    """

    def __init__(
        self,
        workers: VersionedWorkers,
        sampler: Any,
        *,
        groups_per_step: int,
        group_size: int,
        max_staleness: int,
        version: int,
        rank: int = 0,
        world: int = 1,
        seed_key: SeedKey | None = None,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.workers = workers
        workers.generator.version = version  # the weights it was loaded with
        self.sampler = sampler
        self.groups_per_step = groups_per_step
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.first_version = version
        self.rank, self.world = rank, world
        self.seed_key = seed_key
        self.dropped_total = 0
        """Groups dropped as too stale since the start (a metric)."""
        self._version = version
        self._cond = threading.Condition()
        self._queue: deque[_Produced] = deque()
        # (batch index, sampler state before it was drawn) of batches not yet consumed.
        self._drawn: deque[tuple[int, dict[str, Any]]] = deque()
        self._idle_s = 0.0
        self._skipped = 0  # batches left with no fresh group: later ones move up a step
        self._error: BaseException | None = None
        self._stop = False
        self._threads: list[threading.Thread] = []
        # Batches drawn and not all played, by index; the next index to draw.
        self._playing: dict[int, _Produced] = {}
        self._next_index = 0
        self._busy = 0  # episodes being played
        self._idle_since: float | None = time.perf_counter()

    # ---- trainer side ---------------------------------------------------------------

    def start(self) -> None:
        """Start the producer's slots (after the sampler's state is loaded on resume)."""
        if self._threads:
            raise RuntimeError("AsyncRollouts.start was called twice")
        self._threads = [
            threading.Thread(target=self._slot, name=f"bat-async-rollout-{i}", daemon=True)
            for i in range(self.workers.num_envs)
        ]
        for t in self._threads:
            t.start()

    def next_batch(self, version: int) -> AsyncBatch:
        """The next batch with a fresh group, for training at ``version``; waits for one.

        Groups with a token older than ``version - max_staleness`` are dropped (and
        counted); a batch left with no group is skipped for the next.

        Raises:
            BaseException: whatever ended the producer (an env or generation failure).
        """
        t0 = time.perf_counter()
        dropped = 0
        while True:
            with self._cond:
                while not self._queue and self._error is None:
                    self._cond.wait()
                if self._error is not None and not self._queue:
                    raise self._error
                batch = self._queue.popleft()
                while self._drawn and self._drawn[0][0] <= batch.index:
                    self._drawn.popleft()
                idle, self._idle_s = self._idle_s, 0.0
                if self._idle_since is not None:  # the idle spell so far counts for this step
                    now = time.perf_counter()
                    idle, self._idle_since = idle + now - self._idle_since, now
            groups = batch.groups(self.group_size)
            keep = fresh_groups(groups, version, self.max_staleness)
            dropped += keep.count(False)
            if any(keep):
                break
            with self._cond:
                self._skipped += 1
                self._cond.notify_all()
        self.dropped_total += dropped
        if dropped:
            log.info("dropped %d group(s) more than %d version(s) old", dropped, self.max_staleness)
        rollouts = [r for group, k in zip(groups, keep, strict=True) if k for r in group]
        return AsyncBatch(rollouts, dropped, time.perf_counter() - t0, idle)

    @property
    def queued(self) -> int:
        """Batches played in full and waiting for the trainer."""
        with self._cond:
            return len(self._queue)

    def publish(self, version: int, weights: Mapping[str, Any]) -> None:
        """The trainer reached ``version`` with ``weights`` (a copy it will not modify)."""
        self.workers.generator.publish(version, weights)
        with self._cond:
            self._version = version
            self._cond.notify_all()

    def resume_state(self) -> dict[str, Any]:
        """The sampler state a checkpoint should store: before the first unconsumed batch."""
        with self._cond:
            if self._drawn:
                return copy.deepcopy(self._drawn[0][1])
            return copy.deepcopy(self.sampler.state_dict())

    def close(self) -> None:
        """Stop the slots (episodes in flight end at their next generation call) and the envs."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.workers.batcher.close()
        for t in self._threads:
            t.join(timeout=120)
        self.workers.close()

    # ---- producer side --------------------------------------------------------------

    def _slot(self) -> None:
        """One of ``num_envs`` episode slots: play the next episode, again and again.

        A slot that finds every drawn episode taken draws the next batch, once the
        staleness bound lets it start; so a slow episode holds up only its own slot, and
        the next batch's episodes start as the last ones of the current batch finish.
        """
        try:
            while True:
                with self._cond:
                    batch = self._next_episode()
                    if batch is None:
                        return
                    pos = batch.started
                    batch.started += 1
                    if self._busy == 0 and self._idle_since is not None:
                        self._idle_s += time.perf_counter() - self._idle_since
                        self._idle_since = None
                    self._busy += 1
                state_id, pool = batch.episodes[pos]
                key = None
                if self.seed_key is not None:
                    key = (*self.seed_key, self.first_version + batch.index, self.rank, pos)
                played = self.workers.play_one(state_id, key)
                with self._cond:
                    batch.results[pos] = VersionedRollout(
                        played.rollout, played.token_versions, pool
                    )
                    batch.remaining -= 1
                    self._busy -= 1
                    if self._busy == 0:
                        self._idle_since = time.perf_counter()
                    # Hand finished batches over in order.
                    while self._playing:
                        first = min(self._playing)
                        if self._playing[first].remaining:
                            break
                        self._queue.append(self._playing.pop(first))
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the trainer at its next_batch
            with self._cond:
                if not self._stop:
                    self._error = exc
                    self._stop = True  # the other slots end too
                self._cond.notify_all()

    def _next_episode(self) -> _Produced | None:
        """The batch whose next episode a slot plays (drawing one if need be); None: stop.

        Called with the lock held; waits at the staleness bound.
        """
        while not self._stop:
            for index in sorted(self._playing):
                if self._playing[index].started < len(self._playing[index].episodes):
                    return self._playing[index]
            # Batch `index` trains at version first + index (less the batches skipped
            # whole): draw it no earlier than K versions before that.
            bound = self.first_version + self._next_index - self._skipped - self.max_staleness
            if self._version >= bound:
                before = copy.deepcopy(self.sampler.state_dict())
                drawn = self.sampler.next(self.groups_per_step)[self.rank :: self.world]
                self._drawn.append((self._next_index, before))
                episodes = [(d.state_id, d.pool) for d in drawn for _ in range(self.group_size)]
                batch = _Produced(self._next_index, episodes, [None] * len(episodes))
                batch.remaining = len(episodes)
                self._playing[self._next_index] = batch
                self._next_index += 1
                if not episodes:  # this rank has no share of the batch
                    self._queue.append(self._playing.pop(batch.index))
                    self._cond.notify_all()
                continue
            self._cond.wait()
        return None
