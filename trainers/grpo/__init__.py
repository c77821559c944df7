"""Multi-turn GRPO over bat_gym environments.

One optimizer step::

    states   <- next B states (a StageCurriculum round, or fixed state ids)
    rollouts <- G token-level episodes per state, played concurrently     (B*G,)
    r_i      <- rubric reward of episode i                                 (B*G,)
                [- overlong_penalty if a token limit ended it, overlong="penalize" (default)]
                [- unfinished_penalty if a budget ended it, unfinished="penalize" (default)]
    A_i      <- r_i - mean_{j in group(i)} r_j    [/ std, off by default]  (B*G,)
    batch    <- the rollouts, less those a token limit ended (overlong="mask")
    loss     <- clipped-ratio objective on every sampled token with A_i,
                + beta * k3(pi, pi_ref), aggregated seq-mean then token-mean
    theta    <- AdamW(theta, grad loss)

Episodes reach the model only through ``env.reset(options={"state_id": ...})`` and
``env.step``; the model sees and is trained on the exact token ids it sampled
(:mod:`bat_gym.trainers.rollout`), with tool observations at loss mask 0. A turn ends
at one of the sampler's stop tokens; a turn cut by ``max_new_tokens`` ends its episode
unrun (``cut_turn``), as does ``max_total_tokens`` (prompt plus response), and such
``length`` episodes train on their reward less ``overlong_penalty`` by default (``overlong``).

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

The package, one job per module: :mod:`~bat_gym.trainers.grpo.states` (where each
step's states come from), :mod:`~bat_gym.trainers.grpo.batch` (advantages, token
batches, metrics), :mod:`~bat_gym.trainers.grpo.logprobs` (the chunked output head),
:mod:`~bat_gym.trainers.grpo.update` (the micro-batched policy update) and
:mod:`~bat_gym.trainers.grpo.loop` (:func:`train`). The run's settings are
:class:`~bat_gym.trainers.configs.GRPOConfig`; the loss math is
:mod:`bat_gym.trainers.grpo_loss`.
"""

from __future__ import annotations

from bat_gym.trainers.configs import GRPOConfig
from bat_gym.trainers.grpo.loop import train
from bat_gym.trainers.grpo.states import (
    CurriculumStates,
    FixedStates,
    SampledState,
    StateSampler,
)

__all__ = [
    "GRPOConfig",
    "train",
    # where each step's states come from
    "SampledState",
    "StateSampler",
    "FixedStates",
    "CurriculumStates",
]
