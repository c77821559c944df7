"""From played episodes to what the update trains on: advantages, token batches, metrics.

Shapes: ``N`` scored rollouts, ``B`` rows of a micro-batch, ``L`` token positions of a
row, ``T`` the scored (response) positions of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

from bat_gym.rollout import EpisodeResult
from bat_gym.trainers.configs import GRPOConfig
from bat_gym.trainers.fsdp import Dist
from bat_gym.trainers.grpo_loss import filter_uniform_groups, group_advantages

__all__ = [
    "TrainBatch",
    "batch_tensors",
    "chunks",
    "idle_batch",
    "mask_overlong",
    "policy_tokens",
    "rollout_metrics",
    "shaped_reward",
    "train_batch",
]


# --------------------------------------------------------------------------- advantages


class TrainBatch(NamedTuple):
    """The rollouts one update trains on, with their advantages."""

    rollouts: list[EpisodeResult]
    """The scored rollouts kept, (M,)."""
    advantages: torch.Tensor
    """Their advantages, (M,)."""
    at: list[int]
    """Their indices in the step's rollouts (to pick their token versions)."""


def train_batch(rollouts: Sequence[EpisodeResult], cfg: GRPOConfig) -> TrainBatch:
    """The step's rollouts with a verdict, their group-relative advantages, masks applied.

    Null verdicts are dropped; with ``filter_uniform_groups`` so are groups of equal
    rewards; with ``overlong="mask"`` so are token-limited episodes, after the baselines
    (a masked episode still counts in its group's mean).
    """
    scored_at = [i for i, r in enumerate(rollouts) if r.reward_or_none is not None]
    scored = [rollouts[i] for i in scored_at]  # null verdicts dropped
    rewards = torch.tensor([shaped_reward(r, cfg) for r in scored], dtype=torch.float)  # (N,)
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
        scored, adv = mask_overlong(scored, adv)
    return TrainBatch(scored, adv, scored_at)


def shaped_reward(rollout: EpisodeResult, cfg: GRPOConfig) -> float:
    """The reward the advantages see: the rubric's, less a penalty for not finishing.

    ``r' = r - overlong_penalty`` for an episode a token limit ended
    (``overlong="penalize"``), ``r' = r - unfinished_penalty`` for one an env budget
    ended (``unfinished="penalize"``), else ``r' = r``. The rubric scores the workspace
    however the episode ended, so without the second term calling ``finish`` earns
    nothing.
    """
    if cfg.overlong == "penalize" and rollout.stop_reason == "length":
        return rollout.reward - cfg.overlong_penalty
    if cfg.unfinished == "penalize" and rollout.stop_reason == "truncated":
        return rollout.reward - cfg.unfinished_penalty
    return rollout.reward


def mask_overlong(
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


def policy_tokens(rollout: EpisodeResult) -> int:
    """Tokens of ``rollout`` the policy sampled itself: its response less the tool results.

    ``sum_t mask_t`` over the response (``response_mask`` is 1 on sampled tokens, 0 on
    the env's replies), the length that ``seq_mean_token_sum_norm`` divides by.
    """
    return sum(rollout.response_mask)


def chunks(n: int, size: int) -> Iterator[slice]:
    """Slices of ``range(n)``, ``size`` at a time (the last one shorter)."""
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


# --------------------------------------------------------------------------- token batches


def batch_tensors(
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


def idle_batch(pad: int, device: torch.device) -> dict[str, Any]:
    """A one-token batch with nothing to learn: an FSDP rank's padding pass."""
    return {
        "idle": True,
        "input_ids": torch.full((1, 2), pad, dtype=torch.long, device=device),
        "attention_mask": torch.ones((1, 2), dtype=torch.long, device=device),
        "loss_mask": torch.zeros((1, 1), device=device),
    }


# --------------------------------------------------------------------------- metrics


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
    budget_cut: bool
    rerendered: int


def rollout_metrics(
    rollouts: Sequence[EpisodeResult], pools: Sequence[str], dist: Dist
) -> dict[str, Any]:
    """Means over every rank's rollouts: reward (also per pool), length, turns, how they ended."""
    rows: list[_RolloutRow] = dist.all_gather(
        [
            _RolloutRow(r.reward, r.reward_or_none is not None, r.state_id, pool,
                        sum(r.response_mask), r.num_turns, r.stop_reason == "terminated",
                        r.stop_reason == "length", r.stop_reason == "truncated",
                        r.rerendered_replies)
            for r, pool in zip(rollouts, pools, strict=True)
        ]
    )  # fmt: skip
    n = len(rows)
    by_pool: dict[str, list[_RolloutRow]] = {}
    for row in rows:
        by_pool.setdefault(row.pool, []).append(row)
    scored = [row for row in rows if row.scored]
    _, zero_share = filter_uniform_groups(
        torch.tensor([row.reward for row in scored], dtype=torch.float),
        [row.group for row in scored],
    )
    return {
        "reward": sum(row.reward for row in rows) / n,
        # The pools differ in difficulty (a stage row vs a whole episode), so the mean
        # above moves with the batch's mix; per pool it shows learning.
        "reward_by_pool": {p: sum(r.reward for r in v) / len(v) for p, v in by_pool.items()},
        "scored_rollouts": len(scored),
        "zero_advantage_groups": zero_share,
        "response_tokens": sum(row.tokens for row in rows) / n,
        "turns": sum(row.turns for row in rows) / n,
        # The rubric pays the work, not the finish: a policy can trade finishing away
        # while its reward holds, so the finish rate is watched per pool too.
        "finished": sum(row.finished for row in rows) / n,
        "finished_by_pool": {p: sum(r.finished for r in v) / len(v) for p, v in by_pool.items()},
        # Ended by an env budget (turns, tool calls, response tokens) before finish.
        "budget_cut": sum(row.budget_cut for row in rows) / n,
        # Ended by a token limit (a cut turn, max_total_tokens): masked out of the loss
        # under overlong="mask".
        "length_cut": sum(row.length_cut for row in rows) / n,
        # Replies after a turn the chat template re-renders (see TokenEpisode).
        "rerendered_replies": sum(row.rerendered for row in rows) / n,
    }
