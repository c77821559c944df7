"""Where each GRPO step's states come from: fixed ids, or a curriculum round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["CurriculumStates", "FixedStates", "SampledState", "StateSampler"]


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
    """The next rows of a :class:`~bat_gym.curriculum.wrapper.StageCurriculum` round.

    The ids come from the curriculum's pure sampler
    (:class:`~bat_gym.curriculum.sampler.CurriculumSampler`): drawing them resets no env
    and restores no sandbox; only the rollout envs restore each id, G times.
    """

    def __init__(self, curriculum: Any) -> None:
        self.curriculum = curriculum

    def next(self, n: int) -> list[SampledState]:  # noqa: D102
        return [SampledState(d.row.state_id, d.row.pool) for d in self.curriculum.sampler.next(n)]

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return self.curriculum.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.curriculum.sampler.load_state_dict(state)

    def close(self) -> None:  # noqa: D102
        self.curriculum.close()
