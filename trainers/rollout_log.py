"""A bounded sample of each GRPO step's rollouts, kept for ``bat-gym view``.

Layout, inside the run directory::

    rollouts/step_000001.jsonl   one line per kept rollout of step 1
    rollouts/step_000002.jsonl   ...

Each line is an episode trace (:mod:`bat_gym.evaluation.episodes`, format
``bat_gym.episode/1``: messages, execution record, verdict, reward) with these fields
added:

    step            the optimizer step the rollout was played for (1-based, as in
                    ``metrics.jsonl``)
    index           its position among the step's rollouts on this rank
    group           its GRPO group (rollouts of one group share a start state)
    pool            the curriculum pool it was drawn from (``target``, ``mix``, ``e2e``)
    stop_reason     ``terminated``, ``truncated`` or ``length``
    shaped_reward   the reward the advantages saw (after an overlong or unfinished penalty)
    sampled_tokens  tokens the policy generated

At most :data:`KEEP_PER_STEP` rollouts are kept per step: the first rollout of every
group, then the second of every group, and so on, so each start state of the step is
represented before any is repeated. A step's file is written whole and atomically; a
resumed run that redoes a step overwrites it, so the log never holds a step twice.
A viewer pages by step and opens one file per page, so a run of 10,000 kept
rollouts is never read whole. Only rank 0 writes (its own rollouts).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bat_gym.core.files import write_atomic
from bat_gym.evaluation.episodes import episode_trace

__all__ = ["KEEP_PER_STEP", "ROLLOUTS_DIR", "log_rollouts", "sample_indices", "step_file"]

ROLLOUTS_DIR = "rollouts"
#: Rollouts kept per step: 8 keeps a 50-step run's log near a few MB of JSON.
KEEP_PER_STEP = 8


def step_file(out_dir: str | Path, step: int) -> Path:
    """``OUT/rollouts/step_NNNNNN.jsonl`` of a step."""
    return Path(out_dir) / ROLLOUTS_DIR / f"step_{step:06d}.jsonl"


def sample_indices(groups: Sequence[str], keep: int) -> list[int]:
    """Which rollouts to keep: round-robin over groups, at most ``keep``, in batch order.

    Args:
        groups: each rollout's group key (its start state), in batch order, (N,).
        keep: the most to keep.

    >>> sample_indices(["a", "a", "b", "b", "c", "c"], 4)
    [0, 1, 2, 4]
    """
    rank: dict[str, int] = {}
    order = []
    for i, g in enumerate(groups):
        order.append((rank.get(g, 0), i))
        rank[g] = rank.get(g, 0) + 1
    return sorted(i for _, i in sorted(order)[: max(0, keep)])


def log_rollouts(
    out_dir: str | Path,
    step: int,
    rollouts: Sequence[Any],
    pools: Sequence[str],
    *,
    shaped: Sequence[float] | None = None,
    keep: int = KEEP_PER_STEP,
) -> Path:
    """Write the kept rollouts of ``step`` (see the module docstring); returns the file.

    Args:
        out_dir: the GRPO run directory.
        step: the step number (1-based, as logged in ``metrics.jsonl``).
        rollouts: the step's :class:`~bat_gym.rollout.EpisodeResult` s, (N,).
        pools: each rollout's pool, (N,).
        shaped: each rollout's shaped reward, (N,); default the reward.
        keep: the most rollouts kept.
    """
    group_of: dict[str, int] = {}
    groups = [group_of.setdefault(r.state_id, len(group_of)) for r in rollouts]
    lines = []
    for i in sample_indices([r.state_id for r in rollouts], keep):
        r = rollouts[i]
        info = {**r.info, "messages": r.messages, "verdict": r.verdict or r.info.get("verdict")}
        trace = episode_trace(info, reward=r.reward_or_none)
        trace["state_id"] = r.state_id
        trace.update(
            step=step,
            index=i,
            group=groups[i],
            pool=pools[i],
            stop_reason=r.stop_reason,
            shaped_reward=r.reward if shaped is None else shaped[i],
            sampled_tokens=int(sum(r.response_mask)),
        )
        lines.append(json.dumps(trace, default=str) + "\n")
    path = step_file(out_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(lines))
    return path
