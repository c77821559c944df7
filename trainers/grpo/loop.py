"""The GRPO training loop: set up, resume, then one optimizer step after another.

See :mod:`bat_gym.trainers.grpo` for the algorithm; this module wires its parts
together: the sampler and models (:func:`_start`), the envs and rollout workers
(:func:`_play_setup`), the resume (:func:`_resume`), and each step (:func:`_step`):
rollouts, advantages (:mod:`~bat_gym.trainers.grpo.batch`), the update
(:mod:`~bat_gym.trainers.grpo.update`), metrics and checkpoints.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bat_gym.core import progress
from bat_gym.core.errors import ConfigError
from bat_gym.rollout import EpisodeResult
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
from bat_gym.trainers.configs import GRPOConfig
from bat_gym.trainers.fsdp import (
    Dist,
    full_state,
    gathered,
    init_distributed,
    load_optimizer_state,
    shard,
)
from bat_gym.trainers.grpo.batch import rollout_metrics, train_batch
from bat_gym.trainers.grpo.states import CurriculumStates, FixedStates, StateSampler
from bat_gym.trainers.grpo.update import make_optimizer, update
from bat_gym.trainers.grpo_metrics import StepMetrics, warn_without_signal
from bat_gym.trainers.rollout import RolloutWorkers
from bat_gym.trainers.rollout_log import log_rollouts
from bat_gym.trainers.schedule import lr_scheduler
from bat_gym.trainers.tiled_mlp import set_mlp_tiling

__all__ = ["train"]

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
        "max_generated_tokens",
    }
)

# Every rollout's seed key starts with this: episode ``i`` of a step on a rank is keyed
# (*_SEED_KEY, step, rank, i), so its draws do not depend on which episode's turn reaches
# the sampler first, and a resumed run draws what the uninterrupted one would have.
_SEED_KEY = ("grpo",)

# Staleness bounds from which ``train`` plays its rollouts in the background
# (:mod:`bat_gym.trainers.async_rollouts`); below it, the synchronous loop.
_ASYNC_FROM = 1


@dataclass
class _Run:
    """What one run holds from its start to its end."""

    cfg: GRPOConfig
    out: Path
    device: torch.device
    dist: Dist
    ctx: Any
    """bf16 autocast of the forward passes, or a null context."""
    policy: Any
    """The sampler: a TransformersPolicy or a VLLMPolicy."""
    model: Any
    """The trained model (fp32 master weights, sharded under torchrun)."""
    tokenizer: Any
    ref: Any
    """The frozen KL reference model, or None (``kl_coef`` 0)."""
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    checkpoints: CheckpointDir
    sampler: StateSampler | None = None
    workers: Any = None
    pool: Any = None
    """The Ray env pool, or None."""
    source: AsyncRollouts | None = None
    """The background producer of asynchronous rollouts, or None (synchronous)."""

    def close(self) -> None:
        """Stop the producer, then close the envs, the pool, the sampler and the policy."""
        if self.source is not None:
            self.source.close()  # stops the producer before the envs close under it
        if self.workers is not None:
            self.workers.close()
        if self.pool is not None:
            self.pool.close()
        if self.sampler is not None:
            self.sampler.close()
        self.policy.close()


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
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    dist = init_distributed(device)
    torch.manual_seed(cfg.seed + dist.rank)
    checkpoints = CheckpointDir(out, marker=_STATE, keep_last=cfg.keep_last)
    checkpoints.clean_partial()
    latest = checkpoints.latest()
    asynchronous = cfg.max_staleness >= _ASYNC_FROM
    if asynchronous and dist.world > 1:
        raise ConfigError(
            f"max_staleness={cfg.max_staleness} (asynchronous rollouts) runs in one process; "
            f"launch without torchrun (this run has {dist.world}) or set max_staleness=0"
        )
    run = _start(cfg, out, device, dist, latest or cfg.model, checkpoints, asynchronous)
    try:
        _play_setup(run, asynchronous)
        step, history = _resume(run, latest)
        if asynchronous:
            # The producer draws states ahead of the trainer, so it starts after the resume.
            run.source = AsyncRollouts(
                run.workers,
                run.sampler,
                groups_per_step=cfg.groups_per_step,
                group_size=cfg.group_size,
                max_staleness=cfg.max_staleness,
                version=step,
                rank=dist.rank,
                world=dist.world,
                seed_key=_SEED_KEY,
            )
            run.source.start()
        step = _steps(run, step, history, on_step)
    finally:
        run.close()

    final = out / "final"
    weights, _ = full_state(run.model, None, dist)
    if dist.rank == 0:
        run.model.save_pretrained(final, state_dict=weights)
        run.tokenizer.save_pretrained(final)
    return {"steps": step, "final": str(final), "history": history}


def _start(
    cfg: GRPOConfig,
    out: Path,
    device: torch.device,
    dist: Dist,
    start: str,
    checkpoints: CheckpointDir,
    asynchronous: bool,
) -> _Run:
    """The sampler, the model it trains (from ``start``), the reference, the optimizer."""
    from transformers import AutoModelForCausalLM

    bf16 = resolve_bf16(cfg.bf16, device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    policy, model, tokenizer = _load_policy(cfg, start, device, dist, asynchronous)
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
    opt = make_optimizer(model, cfg, device)
    sched = lr_scheduler(
        opt, warmup_steps=cfg.warmup_steps, max_steps=cfg.steps, schedule=cfg.lr_schedule
    )
    return _Run(cfg, out, device, dist, ctx, policy, model, tokenizer, ref, opt, sched, checkpoints)


def _load_policy(
    cfg: GRPOConfig, start: str, device: torch.device, dist: Dist, asynchronous: bool
) -> tuple[Any, Any, Any]:
    """``(policy, model, tokenizer)``: the sampler, and the model the update trains."""
    from transformers import AutoModelForCausalLM

    from bat_gym.policies.transformers_policy import TransformersPolicy

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
        # fp32 master weights whatever the checkpoint's dtype (see the package docstring).
        model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).to(device)
        return policy, model, AutoTokenizer.from_pretrained(start)
    # One set of weights: the policy samples with the very model being trained.
    # Asynchronously, a second one: the policy samples with the last published weights.
    policy = TransformersPolicy(
        start,
        device=str(device),
        dtype="float32",  # the master weights (see the package docstring)
        max_new_tokens=cfg.max_new_tokens,
        max_batch_size=cfg.num_envs,
        chat_template_kwargs=cfg.chat_template_kwargs,
        **sampling,
    )
    model = policy.model
    if asynchronous:
        model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).to(device)
    return policy, model, policy.tokenizer


def _context_length(model: Any, cfg: GRPOConfig) -> int | None:
    """The longest sequence the model (or the vLLM engine) is set up for; None if unknown."""
    limits = [
        getattr(getattr(model, "config", None), "max_position_embeddings", None),
        cfg.vllm_kwargs.get("max_model_len") if cfg.generator == "vllm" else None,
    ]
    known = [int(x) for x in limits if isinstance(x, int) and x > 1]
    return min(known) if known else None


def _play_setup(run: _Run, asynchronous: bool) -> None:
    """The state sampler and the rollout workers, with their envs (local or Ray actors)."""
    import gymnasium as gym

    cfg = run.cfg
    context = _context_length(run.model, cfg)
    if cfg.max_total_tokens is not None and context is not None and cfg.max_total_tokens > context:
        raise ConfigError(
            f"max_total_tokens {cfg.max_total_tokens} is more than the model takes ({context} "
            "tokens, its max_position_embeddings or vLLM's max_model_len): give at most that"
        )
    env_kwargs = cfg.env.gym_kwargs()

    def make_env() -> Any:
        return gym.make("bat/E2E-v0", **env_kwargs)

    if cfg.target is not None:
        from bat_gym.curriculum.wrapper import StageCurriculum

        run.sampler = CurriculumStates(
            StageCurriculum(make_env(), target=cfg.target, seed=cfg.seed, **cfg.curriculum)
        )
    else:
        run.sampler = FixedStates(cfg.state_ids)
    rollout_env = make_env
    if cfg.ray is not None:
        from bat_gym.distributed import ActorEnv, RayEnvPool

        run.pool = pool = RayEnvPool(
            "bat/E2E-v0",
            cfg.num_envs,
            ray_address=None if cfg.ray == "local" else cfg.ray,
            **env_kwargs,
        )
        handles = iter(range(cfg.num_envs))

        def rollout_env() -> Any:
            return ActorEnv(pool, next(handles))

    policy = run.policy

    def generate(prompts: list[list[int]], n: int, **seeding: Any) -> Any:
        return policy.generate_tokens(prompts, max_new_tokens=n, **seeding)

    run.workers = (VersionedWorkers if asynchronous else RolloutWorkers)(
        rollout_env,
        _versioned(generate, policy, cfg) if asynchronous else generate,
        run.tokenizer,
        max_new_tokens=cfg.max_new_tokens,
        num_envs=cfg.num_envs,
        max_batch_size=cfg.num_envs,
        # The sampler's own stop tokens: a turn that ends in one is finished, any other
        # was cut by max_new_tokens.
        stop_token_ids=sorted(policy.stop_token_ids),
        chat_template_kwargs=cfg.chat_template_kwargs,
        max_total_tokens=cfg.max_total_tokens or context,
        cut_turn=cfg.cut_turn,
    )


def _resume(run: _Run, latest: Path | None) -> tuple[int, list[dict[str, Any]]]:
    """Load the newest checkpoint's optimizer, schedule, sampler and RNGs.

    Returns:
        ``(step, history)`` of the checkpoint; ``(0, [])`` for a fresh run. The metrics
        log restarts from it.
    """
    step, history = 0, []
    if latest is not None:
        saved = load_resume_state(latest, _STATE, run.cfg.model_dump(), free=_FREE_ON_RESUME)
        load_optimizer_state(run.model, run.opt, saved["optimizer"], run.dist)
        run.sched.load_state_dict(saved["scheduler"])
        run.sampler.load_state_dict(saved["sampler"])
        set_rng_state(saved["rng"])
        # Rollouts draw by their seed keys (_SEED_KEY), so the redone steps sample as the
        # uninterrupted run's did; any unkeyed request continues the saved seed sequence.
        run.policy.load_sampling_state(saved.get("sampling", {}))
        step, history = saved["step"], saved["history"]
    if run.dist.rank == 0:
        # Steps logged after the last checkpoint are redone: the log restarts from it.
        (run.out / "metrics.jsonl").write_text(
            "".join(json.dumps(h) + "\n" for h in history), encoding="utf-8"
        )
    return step, history


def _steps(
    run: _Run,
    step: int,
    history: list[dict[str, Any]],
    on_step: Callable[[dict[str, Any]], None] | None,
) -> int:
    """Optimizer steps until ``cfg.steps``, each logged and checkpointed; the last step."""
    cfg = run.cfg
    # Shown by the command line (bat-gym train grpo, loop); logged at start and end else.
    steps_task = progress.task("GRPO steps", total=cfg.steps, done=step)
    try:
        while step < cfg.steps and not _budget_spent(cfg, history):
            record = _step(run, step)
            step += 1
            history.append(record)
            if run.dist.rank == 0:
                with (run.out / "metrics.jsonl").open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
            if on_step is not None:
                on_step(record)
            steps_task.advance()
            if step % cfg.save_every == 0 or step == cfg.steps or _budget_spent(cfg, history):
                _checkpoint(run, step, history)
    finally:
        steps_task.close()
    return step


def _budget_spent(cfg: GRPOConfig, history: list[dict[str, Any]]) -> bool:
    """True at the step boundary nearest ``max_generated_tokens`` (None: never).

    Stops when one more step (as long as the last) would overshoot the budget by more
    than the run now falls short of it, so runs cut into rounds miss it by nothing on average.
    """
    if cfg.max_generated_tokens is None or not history:
        return False
    spent = sum(h.get("generated_tokens", 0.0) for h in history)
    return spent + history[-1].get("generated_tokens", 0.0) / 2 >= cfg.max_generated_tokens


def _step(run: _Run, step: int) -> dict[str, Any]:
    """One optimizer step: rollouts, advantages, the update, new weights to the sampler.

    Returns:
        The step's metrics (:class:`~bat_gym.trainers.grpo_metrics.StepMetrics`, as
        plain data); its rollouts are logged for ``bat-gym view``.
    """
    cfg, dist, model = run.cfg, run.dist, run.model
    t0 = time.perf_counter()
    versions, async_stats = None, {}
    if run.source is None:
        rollouts, pools = _play(run, step)
    else:
        # ---- rollouts: the producer's next batch, at most K versions old -----------
        rollouts, pools, versions, async_stats = _async_batch(run.source, step)
    t_rollout = time.perf_counter() - t0
    # ---- rewards and advantages --------------------------------------------------
    batch = train_batch(rollouts, cfg)
    # ---- policy update ---------------------------------------------------------------
    t1 = time.perf_counter()
    lr = run.sched.get_last_lr()[0]
    stats = update(
        model, run.ref, run.opt, batch.rollouts, batch.advantages, cfg, run.device,
        run.tokenizer, run.ctx, dist,
        versions=None if versions is None else [versions[i] for i in batch.at],
        version=step,
        set_checkpointing=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        # A batch with nothing to learn from (every rollout masked or unscored) takes no
        # optimizer step; the schedule still counts the step, which torch would report
        # as a misordered call.
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
        run.sched.step()
    _publish(run, step + 1)
    t_update = time.perf_counter() - t1
    record = StepMetrics.model_validate(
        {
            "step": step + 1,
            **rollout_metrics(rollouts, pools, dist),
            "lr": lr,
            **stats,
            "rollout_s": t_rollout,
            "update_s": t_update,
            # Every rank's sampled response tokens (tool results excluded): the budget's unit.
            "generated_tokens": float(sum(sum(r.response_mask) for r in rollouts) * dist.world),
            **async_stats,
        }
    ).model_dump()  # checked, and plain data for metrics.jsonl and the checkpoint
    if dist.rank == 0:
        log_rollouts(run.out, step + 1, rollouts, pools)  # for bat-gym view
        warn_without_signal(record)  # a flat curve says why
    return record


def _play(run: _Run, step: int) -> tuple[list[EpisodeResult], list[str]]:
    """This rank's share of B groups, G episodes each, played with the current weights."""
    cfg, dist = run.cfg, run.dist
    drawn = run.sampler.next(cfg.groups_per_step)[dist.rank :: dist.world]
    episodes = [d for d in drawn for _ in range(cfg.group_size)]
    run.model.eval()
    with gathered(run.model, dist) if cfg.generator == "transformers" else nullcontext():
        rollouts = run.workers.play(
            [d.state_id for d in episodes],
            [(*_SEED_KEY, step, dist.rank, i) for i in range(len(episodes))],
        )
    return rollouts, [d.pool for d in episodes]


def _publish(run: _Run, version: int) -> None:
    """Hand the updated weights to whoever samples with a copy of them."""
    if run.source is not None:
        # A host copy: the generator loads it at its next call while this model trains
        # on, and it holds no accelerator memory while it waits.
        weights = full_state(run.model, None, run.dist, every_rank=True)[0]
        run.source.publish(
            version, {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
        )
    elif run.cfg.generator == "vllm":
        run.policy.update_weights(full_state(run.model, None, run.dist, every_rank=True)[0])


# ============================================================================ async


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


# ============================================================================ checkpoints


def _checkpoint(run: _Run, step: int, history: list[dict[str, Any]]) -> Path | None:
    """Write the step's checkpoint from full state dicts (gathered from every rank).

    Returns:
        The checkpoint's directory on rank 0, None on the other ranks.
    """
    weights, optim = full_state(run.model, run.opt, run.dist)
    if run.dist.rank != 0:
        return None
    sampler = run.sampler.state_dict() if run.source is None else run.source.resume_state()

    def write(tmp: Path) -> None:
        run.model.save_pretrained(tmp, state_dict=weights)
        run.tokenizer.save_pretrained(tmp)
        torch.save(
            {
                "optimizer": optim,
                "scheduler": run.sched.state_dict(),
                "sampler": sampler,
                "sampling": run.policy.sampling_state(),
                "rng": rng_state(),
                "step": step,
                "history": history,
                "config": run.cfg.model_dump(),
            },
            tmp / _STATE,
        )

    return run.checkpoints.save(step, write)
