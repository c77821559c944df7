"""The RL round view of a Stage Bank: batches of prompt-only rows, built deterministically.

A round is ``batches`` batches of ``batch_size`` rows. Every batch holds the same mix of
three pools, in this order:

* ``"target"``: states whose focus is the target stage (S-target, default 4 of 8);
* ``"mix"``: states of the other stages (S-mix, default 2 of 8);
* ``"e2e"``: E2E states (default 2 of 8).

The reference round is 378 batches of 8 = 3,024 rows (pools 1/2, 1/4, 1/4).

Sampling inside a pool is balanced over ``(track, outcome)``: each pass over the pool
interleaves its ``(track, outcome)`` groups round-robin, in a seeded group order that
also keeps the track counts and the outcome counts within one of each other wherever
the groups allow. A pass takes every row of the pool once, so rows are drawn without
replacement. When a pool runs out before the round ends (a small pool, a long round), a
new, freshly shuffled pass of that pool starts; a row never repeats inside one batch
(a row the new pass would repeat is deferred to a later batch). Each pool has its own
random stream, seeded from ``(seed, target, pool)``, so the same rows and spec always
give the same round, whatever order the rows come in.

>>> from bat_gym.core.spec import StageState
>>> rows = [
...     StageState(state_id=f"t{i}.{f}", benchmark="b", benchmark_version="1", focus=f,
...                track="a", task_id=f"t{i}", messages=({"role": "user", "content": "x"},),
...                snapshot="0" * 64)
...     for i in range(4) for f in ("S1", "S2", "E2E")
... ]
>>> batches = build_round(rows, RoundSpec(target="S1", batches=2))
>>> [[r.pool for r in b] for b in batches][0]
['target', 'target', 'target', 'target', 'mix', 'mix', 'e2e', 'e2e']
>>> sum(len(b) for b in batches)
16
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bat_gym.core.errors import CurriculumError
from bat_gym.core.spec import E2E, ContractRef, Outcome, StageState

__all__ = ["Pool", "POOLS", "RoundSpec", "RLRow", "build_round"]

Pool = Literal["target", "mix", "e2e"]
POOLS: tuple[Pool, ...] = ("target", "mix", "e2e")
"""The pools, in the order their rows appear in a batch."""

_STRICT = ConfigDict(extra="forbid", frozen=True)


class RoundSpec(BaseModel):
    """What one RL round looks like.

    Attributes:
        target: the target stage id (``"S1"`` .. ``"S5"``); not ``"E2E"``, whose
            states form their own pool.
        batch_size: rows per batch.
        target_per_batch: S-target rows per batch.
        mix_per_batch: S-mix rows per batch (states of the other stages).
        e2e_per_batch: E2E rows per batch.
        batches: batches per round (reference: 378, i.e. 3,024 rows).
        seed: seed of the round's random streams.
    """

    model_config = _STRICT

    target: str = Field(pattern=r"^S[1-9][0-9]*$", description="Target stage id.")
    batch_size: int = Field(8, ge=1, description="Rows per batch.")
    target_per_batch: int = Field(4, ge=0, description="S-target rows per batch.")
    mix_per_batch: int = Field(2, ge=0, description="S-mix rows per batch.")
    e2e_per_batch: int = Field(2, ge=0, description="E2E rows per batch.")
    batches: int = Field(378, ge=1, description="Batches per round.")
    seed: int = Field(0, description="Seed of the round's random streams.")

    @model_validator(mode="after")
    def _composition_fills_the_batch(self) -> RoundSpec:
        # A batch that is not exactly filled would change the pool proportions the
        # trainer's advantage normalisation assumes; refuse rather than pad or clip.
        total = self.target_per_batch + self.mix_per_batch + self.e2e_per_batch
        if total != self.batch_size:
            raise ValueError(
                f"expected target_per_batch + mix_per_batch + e2e_per_batch == batch_size "
                f"({self.batch_size}), got {self.target_per_batch} + {self.mix_per_batch} + "
                f"{self.e2e_per_batch} = {total}"
            )
        return self

    @property
    def rows(self) -> int:
        """Rows in the round (``batches * batch_size``)."""
        return self.batches * self.batch_size

    @property
    def per_batch(self) -> dict[Pool, int]:
        """Rows of each pool in every batch."""
        return {
            "target": self.target_per_batch,
            "mix": self.mix_per_batch,
            "e2e": self.e2e_per_batch,
        }


class RLRow(BaseModel):
    """One RL row: a prompt reference only.

    It names the start state to reset to and how it was chosen; it never holds an
    assistant target or a teacher trajectory (the prompt itself is the state's
    ``messages``, restored by ``reset(options={"state_id": ...})``).
    """

    model_config = _STRICT

    state_id: str
    benchmark: str
    target: str = Field(description="The round's target stage.")
    pool: Pool
    focus: str = Field(description="The state's own focus (S1..S5 or E2E).")
    track: str
    outcome: Outcome
    contract: ContractRef | None = Field(description="The reward contract the state pins.")
    provenance: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, state: StageState, target: str, pool: Pool) -> RLRow:
        """The row for ``state`` drawn from ``pool`` in a round targeting ``target``."""
        return cls(
            state_id=state.state_id,
            benchmark=state.benchmark,
            target=target,
            pool=pool,
            focus=state.focus,
            track=state.track,
            outcome=state.outcome,
            contract=state.contract,
            provenance=dict(state.provenance),
        )


class _PoolStream:
    """Rows of one pool, in balanced passes, drawn a batch at a time."""

    def __init__(self, rows: list[StageState], rng: random.Random) -> None:
        self._groups: dict[tuple[str, str], list[StageState]] = {}
        for row in rows:  # rows arrive sorted by state_id, so groups are too
            self._groups.setdefault((row.track, row.outcome), []).append(row)
        self._rng = rng
        self._queue: list[StageState] = []

    def _new_pass(self) -> list[StageState]:
        """Every row of the pool once, visiting the (track, outcome) groups round-robin."""
        left = {key: list(rows) for key, rows in self._groups.items()}
        for rows in left.values():
            self._rng.shuffle(rows)
        tracks = sorted({t for t, _ in left})
        outcomes = sorted({o for _, o in left})
        self._rng.shuffle(tracks)
        self._rng.shuffle(outcomes)
        order = [key for key in _cycle_order(tracks, outcomes) if key in left]
        out: list[StageState] = []
        while left:
            for key in order:
                if key in left:
                    out.append(left[key].pop())
                    if not left[key]:
                        del left[key]
        return out

    def draw(self, k: int) -> list[StageState]:
        """The next ``k`` distinct rows (the pool must hold at least ``k``)."""
        taken: list[StageState] = []
        ids: set[str] = set()
        i = 0
        while len(taken) < k:
            if i == len(self._queue):
                self._queue.extend(self._new_pass())
            row = self._queue[i]
            if row.state_id in ids:
                i += 1  # only across a pass boundary: defer it to a later batch
                continue
            taken.append(self._queue.pop(i))
            ids.add(row.state_id)
        return taken


def _cycle_order(tracks: list[str], outcomes: list[str]) -> list[tuple[str, str]]:
    """Every (track, outcome) pair once, with both marginals within one at every prefix.

    Position ``i`` gets track ``i mod T`` and outcome ``(i + i // L) mod O`` (``L`` is
    ``lcm(T, O)``): inside each block of ``L`` positions both marginals cycle strictly,
    every block ends with all counts equal, and the ``+ i // L`` shift makes the
    ``gcd(T, O)`` blocks cover disjoint pairs, so the order is a permutation of the grid.
    """
    n_t, n_o = len(tracks), len(outcomes)
    span = math.lcm(n_t, n_o)
    return [(tracks[i % n_t], outcomes[(i + i // span) % n_o]) for i in range(n_t * n_o)]


def _pool_rows(rows: list[StageState], target: str) -> dict[Pool, list[StageState]]:
    return {
        "target": [r for r in rows if r.focus == target],
        "mix": [r for r in rows if r.focus not in (target, E2E)],
        "e2e": [r for r in rows if r.focus == E2E],
    }


_POOL_WORDS: dict[Pool, str] = {
    "target": "states with focus {target} (S-target)",
    "mix": "states of stages other than {target} (S-mix)",
    "e2e": "E2E states",
}


def build_round(rows: Sequence[StageState], spec: RoundSpec) -> list[list[RLRow]]:
    """Build one RL round from Stage Bank rows.

    Args:
        rows: the candidate states, e.g. ``list(bank)``; their order does not matter.
        spec: the round's target stage, composition, length and seed.

    Returns:
        ``spec.batches`` batches, each of ``spec.batch_size`` rows: the S-target rows,
        then the S-mix rows, then the E2E rows.

    Raises:
        ValueError: two rows share a state_id; no row has the target stage as focus;
            or a pool the spec draws from holds fewer distinct states than one batch
            takes from it. Each message names what is missing and how to fix it.
    """
    ordered = sorted(rows, key=lambda r: r.state_id)
    dupes = sorted(
        {a.state_id for a, b in zip(ordered, ordered[1:], strict=False) if a.state_id == b.state_id}
    )
    if dupes:
        raise CurriculumError(f"state_id(s) {dupes[:5]} occur more than once; pass each state once")
    focuses = sorted({r.focus for r in ordered})
    if spec.target not in focuses:
        raise CurriculumError(
            f"unknown target stage {spec.target!r}: no state has it as focus (focuses present: "
            f"{focuses}); pick one of those, or build a bank that holds {spec.target} states"
        )
    pools = _pool_rows(ordered, spec.target)
    for pool, k in spec.per_batch.items():
        have = len({r.state_id for r in pools[pool]})
        if k and have < k:
            what = _POOL_WORDS[pool].format(target=spec.target)
            raise CurriculumError(
                f"the {pool!r} pool needs at least {k} {what} per batch, but the rows hold "
                f"{have}; add such states to the bank (bat-gym bank build --tasks-per-track N), "
                f"or lower {pool}_per_batch"
            )
    streams = {
        pool: _PoolStream(pools[pool], random.Random(f"bat-round/{spec.seed}/{spec.target}/{pool}"))
        for pool in POOLS
    }
    per_batch = spec.per_batch
    return [
        [
            RLRow.of(state, spec.target, pool)
            for pool in POOLS
            for state in streams[pool].draw(per_batch[pool])
        ]
        for _ in range(spec.batches)
    ]
