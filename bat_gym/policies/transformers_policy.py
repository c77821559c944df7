"""A local Hugging Face causal LM as a policy: chat template in, Hermes tool calls out.

The model writes its own chat format: the conversation and the tool schemas go through
``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)``.
Qwen-style templates are the target: their models write tool calls as Hermes
``<tool_call>{...}</tool_call>`` text, which is the env's default protocol, so the decoded
reply is the action as it stands.

Decoding is a plain key/value-cached sampling loop rather than ``model.generate``, for
three reasons a trainer cares about: every sampled token's log-probability comes out
under the distribution it was drawn from, each request draws from its own seeded
generator (so a request's tokens do not depend on which others shared its batch), and
:meth:`TransformersPolicy.generate_tokens` continues from exact token ids.

Log-probabilities (``PolicyOutput.logprobs``, natural log) are taken under the
*processed* sampling distribution: ``log_softmax(logits / temperature)`` after the
top-p filter, renormalised over the nucleus. With ``temperature == 0`` (greedy) they
are the raw model's ``log_softmax(logits)``, as vLLM reports them in its
``processed_logprobs`` mode. Only at ``temperature == 1`` and ``top_p == 1`` are they
the model's own log-probabilities; a GRPO trainer recomputes old log-probs itself.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import ConfigError, ModelNotFound
from bat_gym.policies.base import PolicyError
from bat_gym.policies.local import (
    LocalModelPolicy,
    SamplingOverrides,
    TokenGeneration,
    check_sampling,
)

if TYPE_CHECKING:
    import torch

__all__ = ["TransformersPolicy"]

INSTALL_HINT = "pip install 'bat-gym[train]'"


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError(f"the transformers policy needs torch: {INSTALL_HINT}") from exc
    return torch


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"the transformers policy needs transformers: {INSTALL_HINT}") from exc
    return transformers


class TransformersPolicy(LocalModelPolicy):
    """A local causal LM (``AutoModelForCausalLM`` + ``AutoTokenizer``) behind the Policy protocol.

    Args:
        path: a model directory (``save_pretrained`` output) with a chat template.
        device: ``"auto"`` (CUDA when available, else CPU), or a torch device string.
        dtype: ``"auto"`` (the checkpoint's dtype) or a torch dtype name (``"bfloat16"``).
        temperature: sampling temperature (>= 0); 0 decodes greedily.
        top_p: nucleus mass kept before sampling, in (0, 1]; 1 keeps every token.
        max_new_tokens: the most tokens one reply may have (>= 1).
        seed: base seed; None samples differently on every run. With a seed, the
            n-th request always gets the same seed (see :func:`request_seed`).
        max_batch_size: the most sequences one forward pass holds; concurrent
            :meth:`act` calls are gathered up to this many.
        batch_wait_s: seconds :meth:`act` waits for other threads' requests to join
            its batch.
        stop_tokens: tokens that end a reply besides the tokenizer's and generation
            config's end-of-sequence ids (those missing from the vocabulary are ignored).
        chat_template_kwargs: extra ``apply_chat_template`` arguments for every prompt,
            e.g. ``{"enable_thinking": False}`` for Qwen3's thinking switch.
        trust_remote_code: passed to ``from_pretrained``; only for checkpoints you trust.

    Attributes:
        model: the ``torch.nn.Module``; a trainer may update its weights in place
            between calls (not during one).
        tokenizer: the tokenizer, with the chat template.
        stop_token_ids: the ids that end a reply.
        batcher: the :class:`~bat_gym.policies.batching.MicroBatcher` behind :meth:`act`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 1024,
        seed: int | None = None,
        max_batch_size: int = 8,
        batch_wait_s: float = 0.01,
        stop_tokens: Sequence[str] = ("<|im_end|>",),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        check_sampling(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens)
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        torch = _import_torch()
        transformers = _import_transformers()
        self.path = Path(path)
        if not self.path.is_dir():
            raise ModelNotFound(str(self.path))
        self.name = f"hf:{self.path.name}"
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            self.path, trust_remote_code=trust_remote_code
        )
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                f"{self.path} has no chat template; the policy renders conversations with it"
            )
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.path,
            trust_remote_code=trust_remote_code,
            dtype=dtype if dtype == "auto" else getattr(torch, dtype),
        ).to(self.device)
        self.model.eval()
        config_eos = getattr(self.model.generation_config, "eos_token_id", None)
        self.stop_token_ids = self._stop_ids(stop_tokens, eos=(config_eos,))
        if not self.stop_token_ids:
            raise ConfigError(
                f"{self.path}: no end-of-sequence token in the tokenizer or generation "
                "config, and none of stop_tokens is in the vocabulary"
            )
        pad = self.tokenizer.pad_token_id
        self.pad_token_id: int = pad if pad is not None else min(self.stop_token_ids)
        params = inspect.signature(self.model.forward).parameters
        # transformers 5 renamed the cache argument; older releases call it past_key_values.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_last = "logits_to_keep" in params
        self._lock = threading.Lock()  # one decoding loop on the model at a time
        self._serve(max_batch_size=max_batch_size, batch_wait_s=batch_wait_s)

    # -- Policy protocol -----------------------------------------------------------

    def _sample(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None]
    ) -> list[tuple[TokenGeneration, str]]:
        out = []
        # Through generate_tokens, so whatever wraps it (a trainer's hook) sees act's calls too.
        for gen in self.generate_tokens(prompts, seeds=seeds):
            shown = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
            out.append((gen, self.tokenizer.decode(shown, skip_special_tokens=True)))
        return out

    def identity(self) -> dict[str, Any]:
        """Kind, checkpoint path and digest, and the generation settings.

        The digest names the files the policy was loaded from; after a trainer has
        updated :attr:`model` in place, save a checkpoint and record that one's.
        """
        return self._identity(
            "transformers",
            *("temperature", "top_p", "max_new_tokens", "seed"),
            dtype=str(self.model.dtype).removeprefix("torch."),
        )

    # -- token level ---------------------------------------------------------------

    def _generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], call: SamplingOverrides
    ) -> list[TokenGeneration]:
        """Decode ``prompts`` in batches of :attr:`max_batch_size`, one at a time on the model."""
        max_new = self.max_new_tokens if call.max_new_tokens is None else call.max_new_tokens
        temp = self.temperature if call.temperature is None else call.temperature
        nucleus = self.top_p if call.top_p is None else call.top_p
        if max_new < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new}")
        if any(len(p) == 0 for p in prompts):
            raise ConfigError("every prompt needs at least one token")
        out: list[TokenGeneration] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = slice(start, start + self.max_batch_size)
            try:
                with self._lock, self._eval_mode():
                    out.extend(self._decode(prompts[chunk], seeds[chunk], max_new, temp, nucleus))
            except RuntimeError as exc:  # torch reports OOM and device faults this way
                raise PolicyError(f"{self.name}: generation failed: {exc}") from exc
        return out

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """Sample in eval mode: a trainer may have left the model training (dropout on)."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    def _unseeded(self, n: int) -> list[int]:
        """Fresh random seeds: every request of an unseeded policy samples differently."""
        rng = random.SystemRandom()
        return [rng.getrandbits(63) for _ in range(n)]

    def _decode(
        self,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        max_new: int,
        temperature: float,
        top_p: float,
    ) -> list[TokenGeneration]:
        """The sampling loop over one left-padded batch, with a key/value cache."""
        torch = _import_torch()
        batch, width = len(prompts), max(len(p) for p in prompts)
        dev = self.device
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        # Left padding: positions count real tokens only, so row i's prompt sits at 0..P_i-1.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = [torch.Generator(device=dev).manual_seed(s) for s in seeds]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        live = list(range(batch))
        cache = None
        step_ids, step_pos = input_ids, positions
        # no_grad, not inference_mode: a trainer may share these weights, and FSDP2 reuses
        # the unsharded parameter buffers it fills here, which must stay normal tensors
        # (an inference tensor cannot be updated in place outside inference mode).
        with torch.no_grad():
            for _ in range(max_new):
                kwargs: dict[str, Any] = {"attention_mask": mask, "position_ids": step_pos}
                if cache is not None:
                    kwargs[self._cache_arg] = cache
                if self._keep_last:
                    kwargs["logits_to_keep"] = 1
                out = self.model(input_ids=step_ids, use_cache=True, **kwargs)
                cache = out.cache if hasattr(out, "cache") else out.past_key_values
                logits = out.logits[:, -1, :].float()  # (B, V)
                chosen, chosen_lp = _sample(logits, temperature, top_p, gens)
                for i in list(live):
                    tokens[i].append(chosen[i])
                    logprobs[i].append(chosen_lp[i])
                    if chosen[i] in self.stop_token_ids:
                        reasons[i] = "stop"
                        live.remove(i)
                if not live:
                    break
                # Finished rows keep decoding a pad token; their outputs are ignored.
                nxt = [chosen[i] if i in live else self.pad_token_id for i in range(batch)]
                step_ids = torch.tensor(nxt, dtype=torch.long, device=dev).unsqueeze(-1)
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)
        return [TokenGeneration(tokens[i], logprobs[i], reasons[i]) for i in range(batch)]


def _sample(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generators: Sequence[torch.Generator],
) -> tuple[list[int], list[float]]:
    """One token per row, and its log-probability under the distribution it came from.

    Greedy (``temperature == 0``): argmax, scored by ``log_softmax(logits)``.
    Sampling: ``log p = log_softmax(logits / T)`` with tokens outside the top-p nucleus
    set to -inf first (so the nucleus is renormalised), then one draw per row from
    that row's generator.
    """
    torch = _import_torch()
    if temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)  # (B, V)
        chosen = logp.argmax(dim=-1)  # (B,)
    else:
        scaled = logits / temperature  # (B, V)
        if top_p < 1:
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            # Drop a token when the mass strictly before it already reaches top_p; the
            # most likely token is always kept.
            drop = (probs.cumsum(dim=-1) - probs) >= top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
        logp = torch.log_softmax(scaled, dim=-1)  # (B, V)
        probs = logp.exp()
        chosen = torch.stack(
            [torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(generators)]
        )
    picked = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)  # (B,)
    return chosen.tolist(), picked.tolist()
