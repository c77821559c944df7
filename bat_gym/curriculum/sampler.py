"""CurriculumSampler: the next state ids of an RL round, drawn from the states' metadata.

The sampler is pure: it touches no env and no sandbox. It reads the candidate states'
metadata once (id, focus, track, outcome: the rows of a Stage Bank), builds round ``r``
with seed ``seed + r`` (:func:`~bat_gym.curriculum.rounds.build_round`, whose pools
draw from seeded generators) and hands out the round's rows in order, round after
round. A round is a function of the rows, the spec and the round index alone, so where
a run stands is a few counts (round, rows drawn) next to the spec and its seed:
:meth:`CurriculumSampler.state_dict` is plain JSON, and a sampler that loads it draws
exactly what the unbroken run would have drawn.

>>> sampler = CurriculumSampler.from_source(bank, RoundSpec(target="S2"))  # doctest: +SKIP
>>> [d.row.state_id for d in sampler.next(8)]  # one batch  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from bat_gym.core.errors import CurriculumError, StateNotAdmitted
from bat_gym.core.spec import StageState
from bat_gym.curriculum.rounds import RLRow, RoundSpec, build_round

__all__ = ["CurriculumSampler", "Draw"]

_STATE_VERSION = 1


class Draw(NamedTuple):
    """One drawn row and where in the run it sits.

    ``where`` is ``{"round", "batch", "index", "pool", "target"}``: the round index, the
    batch inside the round, the row's index inside its batch, its pool and the target.
    """

    row: RLRow
    where: dict[str, Any]


class CurriculumSampler:
    """Rows of RL rounds, one :meth:`draw` at a time; round ``r`` is seeded ``seed + r``.

    When a round's rows are used up the next round starts; :meth:`set_target` starts a
    new round at once.

    Args:
        rows: the candidate states' metadata (e.g. ``list(bank)``); their order does not
            matter. Every round draws from these.
        spec: the first round's target, composition, length and seed.

    Raises:
        CurriculumError: the rows cannot fill a round's pools (see
            :func:`~bat_gym.curriculum.rounds.build_round`).
    """

    def __init__(self, rows: Sequence[StageState], spec: RoundSpec) -> None:
        self._rows = list(rows)
        self._spec = spec
        self._round_index = 0
        self._cursor = 0  # rows of the current round already drawn
        self._round: list[RLRow] = []
        self.last: Draw | None = None
        """The latest draw (what a GRPO group repeats); None before the first."""
        self._build()

    @classmethod
    def from_source(cls, source: Any, spec: RoundSpec) -> CurriculumSampler:
        """A sampler over every admitted state of ``source``.

        ``source`` is anything with ``select()`` and ``get()`` (a
        :class:`~bat_gym.bank.StageBank`, an env's ``states``).
        """
        rows = []
        # select() and get() are all a StateSource promises (no iteration); a lazily
        # built source may list a row its demonstration did not win.
        for state_id in source.select():
            with contextlib.suppress(StateNotAdmitted):
                rows.append(source.get(state_id))
        return cls(rows, spec)

    # -- the round -----------------------------------------------------------------

    @property
    def target(self) -> str:
        """The current target stage id."""
        return self._spec.target

    @property
    def round_spec(self) -> RoundSpec:
        """The spec of the current round (its seed is ``seed + round index``)."""
        return self._spec.model_copy(update={"seed": self._spec.seed + self._round_index})

    @property
    def round_index(self) -> int:
        """How many rounds were started before the current one."""
        return self._round_index

    @property
    def current_round(self) -> list[RLRow]:
        """The current round's rows, batch after batch."""
        return list(self._round)

    def upcoming(self, n: int) -> list[str]:
        """The state ids of the next ``n`` draws of this round (fewer at its end)."""
        return [r.state_id for r in self._round[self._cursor : self._cursor + n]]

    def set_target(self, stage_id: str) -> None:
        """Switch to a new target stage id (``"S3"``) and start a new round for it."""
        self._spec = self._spec.model_copy(update={"target": stage_id})
        self._round_index += 1
        self._build()

    def _build(self) -> None:
        self._round = [row for batch in build_round(self._rows, self.round_spec) for row in batch]
        self._cursor = 0

    # -- drawing ---------------------------------------------------------------------

    def draw(self) -> Draw:
        """The next row of the round (starting the next round when this one is used up)."""
        if self._cursor >= len(self._round):
            self._round_index += 1
            self._build()
        row = self._round[self._cursor]
        size = self._spec.batch_size
        where = {
            "round": self._round_index,
            "batch": self._cursor // size,
            "index": self._cursor % size,
            "pool": row.pool,
            "target": row.target,
        }
        self._cursor += 1
        self.last = Draw(row, where)
        return self.last

    def next(self, n: int) -> list[Draw]:
        """The next ``n`` draws."""
        return [self.draw() for _ in range(n)]

    # -- resuming --------------------------------------------------------------------

    def _rows_digest(self) -> str:
        ids = "\n".join(sorted(r.state_id for r in self._rows))
        return hashlib.sha256(ids.encode()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands, as plain JSON-able data (see the module docstring)."""
        last = self.last
        return {
            "version": _STATE_VERSION,
            "spec": self._spec.model_dump(),
            "round": self._round_index,
            "cursor": self._cursor,
            "last": None if last is None else last.row.model_dump(mode="json"),
            "last_where": None if last is None else dict(last.where),
            "rows_sha256": self._rows_digest(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; its spec replaces this sampler's.

        Raises:
            CurriculumError: the dict is of another version, was saved over other states
                (the next state ids would differ), or its cursor is outside its round.
        """
        if state.get("version") != _STATE_VERSION:
            raise CurriculumError(
                f"expected a curriculum state dict of version {_STATE_VERSION}, "
                f"got version {state.get('version')!r}"
            )
        if state["rows_sha256"] != self._rows_digest():
            raise CurriculumError(
                "the state dict was saved over other states (their ids differ from this "
                "sampler's); load it into a curriculum over the same bank"
            )
        self._spec = RoundSpec.model_validate(state["spec"])
        self._round_index = int(state["round"])
        self._build()
        cursor = int(state["cursor"])
        if not 0 <= cursor <= len(self._round):
            raise CurriculumError(f"expected a cursor in [0, {len(self._round)}], got {cursor}")
        self._cursor = cursor
        self.last = None
        if state["last"] is not None:
            self.last = Draw(RLRow.model_validate(state["last"]), dict(state["last_where"]))
