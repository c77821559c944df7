"""What the local-model backends (transformers, vLLM) share, on top of the Policy protocol.

A :class:`LocalModelPolicy` renders each conversation with the model's own chat
template (:meth:`~LocalModelPolicy.prompt_token_ids`), samples it at the token level,
seeds each request by its :attr:`~bat_gym.policies.PolicyRequest.seed_key` (or, without
one, gives the n-th request the n-th seed of its base seed: :func:`request_seed`), gathers
concurrent :meth:`~LocalModelPolicy.act` calls into one batch, and names its weights by
a digest of the checkpoint files. A backend implements only :meth:`_sample` (and its
token-level ``generate_tokens``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bat_gym.core.errors import ConfigError
from bat_gym.policies.base import Policy, PolicyOutput, PolicyRequest, SeedKey, keyed_seed
from bat_gym.policies.batching import MicroBatcher

__all__ = [
    "LocalModelPolicy",
    "SamplingOverrides",
    "TokenGeneration",
    "chat_messages",
    "check_sampling",
    "checkpoint_digest",
    "request_seed",
]

# Files whose bytes decide what the model does: weights, configs, tokenizer, template.
_DIGEST_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".json",
    ".jinja",
    ".model",
    ".txt",
)


class TokenGeneration(NamedTuple):
    """One sampled continuation at the token level.

    Attributes:
        token_ids: the sampled tokens, shape ``(T,)``; a stop token that ended the
            sequence is the last one.
        logprobs: each token's log-probability under the sampling distribution,
            shape ``(T,)``, natural log (see the module doc for which distribution).
        finish_reason: ``"stop"`` (a stop token was sampled) or ``"length"``
            (``max_new_tokens`` ran out).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class SamplingOverrides(NamedTuple):
    """One :meth:`~LocalModelPolicy.generate_tokens` call's settings; None: the policy's own."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


def checkpoint_digest(path: str | Path) -> str:
    """SHA-256 over a checkpoint directory's weight, config and tokenizer files.

    Each file's name and bytes go in, in name order, so a renamed shard counts as a
    change. Files other than weights, JSON configs, templates and vocabularies
    (READMEs, images) are left out.
    """
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.iterdir() if p.is_file())
    h = hashlib.sha256()
    for file in files:
        if not file.name.endswith(_DIGEST_SUFFIXES):
            continue
        h.update(file.name.encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def request_seed(base_seed: int, index: int) -> int:
    """The sampling seed of the ``index``-th request of a policy seeded ``base_seed``.

    Seeds are drawn per request, not per batch, so a seeded policy gives the same
    tokens for the n-th request however requests were grouped into batches.
    """
    return (base_seed * 1_000_003 + index * 7_919 + 1) % (1 << 63)


def check_sampling(
    *, temperature: float, top_p: float, max_tokens: int, max_tokens_name: str = "max_new_tokens"
) -> None:
    """Refuse sampling settings no backend can honour, naming the bad one.

    Args:
        temperature: sampling temperature; must be >= 0 (0 decodes greedily).
        top_p: nucleus mass kept; must be in (0, 1].
        max_tokens: the most tokens one reply may have; must be >= 1.
        max_tokens_name: what the backend calls ``max_tokens``, for the message.
    """
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
    if max_tokens < 1:
        raise ConfigError(f"{max_tokens_name} must be >= 1, got {max_tokens}")


def chat_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The env's OpenAI-format messages, made ready for a Hugging Face chat template.

    Tool-call arguments arrive as JSON strings (OpenAI format); chat templates expect
    objects, and some (Qwen2.5's) would quote a string a second time. Arguments that
    are not a valid JSON object stay as they are.
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        fixed = []
        for call in calls:
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except json.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
            fixed.append({**call, "function": fn})
        out.append({**message, "tool_calls": fixed})
    return out


class LocalModelPolicy(Policy):
    """A model run in this process (or its engine), behind the Policy protocol.

    Subclasses set :attr:`path`, :attr:`seed` and :attr:`tokenizer`, call
    :meth:`_serve` at the end of ``__init__``, and implement :meth:`_sample`.

    Attributes:
        path: the checkpoint directory.
        seed: base seed; None: every request samples differently.
        tokenizer: the tokenizer, with the chat template.
        chat_template_kwargs: extra ``apply_chat_template`` arguments every prompt is
            rendered with (e.g. ``{"enable_thinking": False}``).
        batcher: the :class:`~bat_gym.policies.batching.MicroBatcher` behind :meth:`act`.
    """

    path: Path
    seed: int | None
    tokenizer: Any
    chat_template_kwargs: dict[str, Any]

    def _serve(self, *, max_batch_size: int, batch_wait_s: float) -> None:
        """Set up request seeding, the digest cache and the batcher behind :meth:`act`."""
        if not hasattr(self, "chat_template_kwargs"):  # a subclass that sets none
            self.chat_template_kwargs = {}
        self._seed_lock = threading.Lock()
        self._requests_seeded = 0
        self._digest: str | None = None
        self.batcher: MicroBatcher[PolicyRequest, PolicyOutput] = MicroBatcher(
            self.act_batch,
            max_batch_size=max_batch_size,
            wait_s=batch_wait_s,
            name=f"{self.name}-batcher",
        )

    @abstractmethod
    def _sample(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None]
    ) -> list[tuple[TokenGeneration, str]]:
        """One generation per prompt at the policy's settings, with its reply text.

        ``seeds`` gives one sampling seed per prompt (:meth:`_resolve_seeds`). The text
        leaves out the stop token and special tokens.
        """

    @abstractmethod
    def _generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], call: SamplingOverrides
    ) -> list[TokenGeneration]:
        """:meth:`generate_tokens` once its seeds are resolved, with the ``call``'s settings."""

    def act(self, request: PolicyRequest) -> PolicyOutput:
        """One reply; concurrent calls from several threads share one batch."""
        return self.batcher(request)

    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        """One reply per request.

        Raises:
            PolicyError: generation failed (out of memory, a device or engine error).
        """
        prompts = [self.prompt_token_ids(r) for r in requests]
        seeds = self._resolve_seeds(len(requests), None, [r.seed_key for r in requests])
        return [
            PolicyOutput(
                text=text,
                prompt_token_ids=prompt,
                token_ids=gen.token_ids,
                logprobs=gen.logprobs,
                finish_reason=gen.finish_reason,
                usage={"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids)},
            )
            for prompt, (gen, text) in zip(prompts, self._sample(prompts, seeds), strict=True)
        ]

    def generate_tokens(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seeds: Sequence[int] | None = None,
        seed_keys: Sequence[SeedKey | None] | None = None,
    ) -> list[TokenGeneration]:
        """Sample a continuation of each prompt, given as token ids (no re-tokenising).

        Args:
            prompts: token ids per prompt, e.g. a whole multi-turn episode so far
                ending with the assistant's generation prompt.
            max_new_tokens: per-call override of the policy's setting.
            temperature: per-call override (0: greedy).
            top_p: per-call override.
            seeds: one sampling seed per prompt; default: the policy's per-request
                seeds (:func:`request_seed`), or fresh ones if it has no seed.
            seed_keys: instead of ``seeds``, one key per prompt (None for none): a
                keyed prompt samples with :func:`~bat_gym.policies.keyed_seed` of the
                policy's seed and its key, whatever else is in the batch (see
                :attr:`~bat_gym.policies.PolicyRequest.seed_key`).

        Returns:
            One :class:`TokenGeneration` per prompt, in order.

        Raises:
            PolicyError: generation failed (out of memory, a device or engine error).
            ValueError: a setting is out of range, a prompt is empty, ``seeds`` or
                ``seed_keys`` does not match ``prompts``, or both are given.
        """
        seeds = self._resolve_seeds(len(prompts), seeds, seed_keys)
        return self._generate(prompts, seeds, SamplingOverrides(max_new_tokens, temperature, top_p))

    def prompt_token_ids(self, request: PolicyRequest) -> list[int]:
        """The request's conversation through the chat template, as token ids."""
        text = self.tokenizer.apply_chat_template(
            chat_messages(request.messages),
            tools=list(request.tools) or None,
            add_generation_prompt=True,
            tokenize=False,
            **self.chat_template_kwargs,
        )
        # The template writes every special token itself; the tokenizer must add none.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def sampling_state(self) -> dict[str, Any]:
        """Where the per-request seed sequence stands (see :func:`request_seed`).

        A trainer saves it with a checkpoint and hands it to
        :meth:`load_sampling_state` on resume, so the resumed run's n-th request gets
        the seed the uninterrupted run's would have.
        """
        with self._seed_lock:
            return {"requests_seeded": self._requests_seeded}

    def load_sampling_state(self, state: dict[str, Any]) -> None:
        """Continue the seed sequence of a :meth:`sampling_state`; ``{}`` keeps it as it is."""
        if "requests_seeded" in state:
            with self._seed_lock:
                self._requests_seeded = int(state["requests_seeded"])

    def _request_seeds(self, n: int) -> list[int] | None:
        """The seeds of the next ``n`` requests (see :func:`request_seed`); None if unseeded."""
        if self.seed is None:
            return None
        with self._seed_lock:
            first = self._requests_seeded
            self._requests_seeded += n
        return [request_seed(self.seed, first + i) for i in range(n)]

    def _seeds_of(self, keys: Sequence[SeedKey | None]) -> list[int] | None:
        """One sampling seed per request: :func:`keyed_seed` of its key, else the next in sequence.

        Only requests without a key advance the sequence, so keyed and unkeyed callers
        of one policy do not shift each other's seeds. None if the policy is unseeded.
        """
        if self.seed is None:
            return None
        base = self.seed
        unkeyed = iter(self._request_seeds(sum(k is None for k in keys)) or ())
        return [next(unkeyed) if k is None else keyed_seed(base, k) for k in keys]

    def _resolve_seeds(
        self,
        n: int,
        seeds: Sequence[int] | None,
        seed_keys: Sequence[SeedKey | None] | None,
    ) -> list[int | None]:
        """One sampling seed per prompt for ``generate_tokens``'s seeding arguments.

        ``seeds`` as given; else :meth:`_seeds_of` the keys (all None when absent); an
        unseeded policy gets :meth:`_unseeded` instead.

        Raises:
            ConfigError: both arguments are given, or one does not have ``n`` entries.
        """
        if seeds is not None and seed_keys is not None:
            raise ConfigError("give seeds or seed_keys, not both")
        for name, given in (("seeds", seeds), ("seed_keys", seed_keys)):
            if given is not None and len(given) != n:
                raise ConfigError(f"got {len(given)} {name} for {n} prompts")
        if seeds is not None:
            return list(seeds)
        keyed = self._seeds_of(seed_keys or [None] * n)
        return self._unseeded(n) if keyed is None else list(keyed)

    def _unseeded(self, n: int) -> list[int | None]:
        """Seeds of ``n`` requests of an unseeded policy: None, the engine draws its own."""
        return [None] * n

    def _stop_ids(self, stop_tokens: Sequence[str], eos: Iterable[Any] = ()) -> frozenset[int]:
        """The token ids that end a reply.

        The tokenizer's end of sequence, ``eos`` (ints or lists of ints, e.g. a
        generation config's ``eos_token_id``) and the ids of those ``stop_tokens`` that
        are in the vocabulary.
        """
        ids: set[int] = set()
        for value in (*eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in stop_tokens if t in vocab)
        return frozenset(ids)

    def _identity(self, kind: str, *settings: str, **extra: Any) -> dict[str, Any]:
        """:meth:`identity`: ``kind``, name, checkpoint path and digest, then settings.

        ``settings`` name attributes recorded as they are, ``extra`` values recorded
        beside them; ``chat_template_kwargs`` come last, when set (they change the prompts).
        """
        kwargs = self.chat_template_kwargs
        return {
            "kind": kind,
            "name": self.name,
            "path": str(self.path.resolve()),
            "sha256": self.checkpoint_sha256(),
            **{name: getattr(self, name) for name in settings},
            **extra,
            **({"chat_template_kwargs": dict(kwargs)} if kwargs else {}),
        }

    def checkpoint_sha256(self) -> str:
        """:func:`checkpoint_digest` of :attr:`path`, computed once.

        It names the files the policy was loaded from; after a trainer has updated the
        weights in place, save a checkpoint and record that one's.
        """
        if self._digest is None:
            self._digest = checkpoint_digest(self.path)
        return self._digest

    def close(self) -> None:
        """Stop the batching thread."""
        self.batcher.close()
