"""StageCurriculum: a wrapper whose ``reset()`` walks an RL round of stage states.

Any trainer that drives a Gymnasium env gets the Benchmark-as-Teacher curriculum by
wrapping the env: every ``reset()`` restores the next state of the current round
(:func:`bat_gym.rounds.build_round`), and ``step()`` is untouched.

>>> import gymnasium as gym
>>> env = StageCurriculum(gym.make("bat/E2E-v0", states=bank), target="S2")  # doctest: +SKIP
>>> obs, info = env.reset()  # doctest: +SKIP
>>> info["curriculum"]  # doctest: +SKIP
{'round': 0, 'batch': 0, 'index': 0, 'pool': 'target', 'target': 'S2'}
>>> obs, info = env.reset(options={"repeat": True})  # same state: a GRPO group # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, SupportsFloat

import gymnasium as gym

from bat_gym.env import StageEnv
from bat_gym.errors import CurriculumError, NotAStageEnv, StateNotAdmitted
from bat_gym.rounds import RLRow, RoundSpec, build_round
from bat_gym.spec import StageState

__all__ = ["StageCurriculum"]

_STATE_VERSION = 1


class StageCurriculum(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Reset to the states of an RL round, one row per ``reset()``, round after round.

    Round ``r`` is built with seed ``seed + r`` from the env's states (or ``states``),
    so a run is reproducible from its constructor arguments alone. When a round's rows
    are used up the next round starts; :meth:`set_target` starts a new round at once.
    The order of states never depends on ``reset(seed=...)``, which still seeds the
    inner env.

    Reset options (any other option goes to the inner env unchanged):

    * ``repeat=True``: restore the last state again (the G rollouts of a GRPO group);
      it does not advance the round.
    * ``state_id=...``: bypass the curriculum for this reset (e.g. evaluation); the
      round does not advance and ``info`` gets no ``"curriculum"`` entry.

    Args:
        env: a :class:`~bat_gym.env.StageEnv` or any wrapper around one (e.g. the
            RubricReward env of ``gym.make("bat/E2E-v0", states=bank)``).
        target: the target stage, as an id (``"S3"``) or name (``"Validate"``).
        states: where the round's rows come from: anything with ``select()`` and
            ``get()`` (a :class:`~bat_gym.bank.StageBank`); default: the inner env's
            states. Its state ids must be ones the inner env can reset to.
        batch_size: rows per batch.
        target_per_batch: S-target rows per batch.
        mix_per_batch: S-mix rows per batch.
        e2e_per_batch: E2E rows per batch.
        batches: batches per round (reference: 378, i.e. 3,024 resets).
        seed: seed of round 0; round ``r`` uses ``seed + r``.

    Raises:
        TypeError: ``env.unwrapped`` is not a StageEnv.
        ValueError: the composition does not fill the batch, or the states cannot
            fill a round's pools (see :func:`~bat_gym.rounds.build_round`).
        StageNotFound: ``target`` is not a stage of the env's benchmark.
    """

    def __init__(
        self,
        env: gym.Env[str, str],
        *,
        target: str = "S1",
        states: Any = None,
        batch_size: int = 8,
        target_per_batch: int = 4,
        mix_per_batch: int = 2,
        e2e_per_batch: int = 2,
        batches: int = 378,
        seed: int = 0,
    ) -> None:
        if not isinstance(env.unwrapped, StageEnv):
            raise NotAStageEnv(
                f"StageCurriculum resets StageEnv episodes; expected an env whose unwrapped "
                f"is a StageEnv, got {type(env.unwrapped).__name__}"
            )
        gym.utils.RecordConstructorArgs.__init__(
            self,
            target=target,
            states=states,
            batch_size=batch_size,
            target_per_batch=target_per_batch,
            mix_per_batch=mix_per_batch,
            e2e_per_batch=e2e_per_batch,
            batches=batches,
            seed=seed,
        )
        gym.Wrapper.__init__(self, env)
        self._states_arg = states
        # Validated now, so a bad composition fails at construction, not mid-training.
        self._spec = RoundSpec(
            target=self._stage_id(target),
            batch_size=batch_size,
            target_per_batch=target_per_batch,
            mix_per_batch=mix_per_batch,
            e2e_per_batch=e2e_per_batch,
            batches=batches,
            seed=seed,
        )
        self._rows: list[StageState] | None = None
        self._round_index = 0
        self._cursor = 0  # rows of the current round already used
        self._round: list[RLRow] = []
        self._last: RLRow | None = None
        self._last_where: dict[str, Any] | None = None
        self._build()

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
        """The state ids of the next ``n`` curriculum resets of this round (fewer at its end)."""
        return [r.state_id for r in self._round[self._cursor : self._cursor + n]]

    def set_target(self, stage: str) -> None:
        """Switch to a new target stage (id or name) and start a new round for it."""
        self._spec = self._spec.model_copy(update={"target": self._stage_id(stage)})
        self._round_index += 1
        self._build()

    def _stage_id(self, stage: str) -> str:
        focus = self.env.unwrapped.benchmark.spec.focus(stage)
        if focus == "E2E":
            raise CurriculumError(
                "target must be a stage (S1, S2, ...; or its name), got 'E2E': E2E states "
                "are their own pool in every batch (e2e_per_batch)"
            )
        return focus

    def _source_rows(self) -> list[StageState]:
        if self._rows is None:
            src = self._states_arg if self._states_arg is not None else self.env.unwrapped.states
            # select() and get() are all a StateSource promises (no iteration); a
            # lazily built source may list a row its demonstration did not win.
            self._rows = []
            for state_id in src.select():
                with contextlib.suppress(StateNotAdmitted):
                    self._rows.append(src.get(state_id))
        return self._rows

    def _build(self) -> None:
        flat = build_round(self._source_rows(), self.round_spec)
        self._round = [row for batch in flat for row in batch]
        self._cursor = 0

    def _rows_digest(self) -> str:
        ids = "\n".join(sorted(r.state_id for r in self._source_rows()))
        return hashlib.sha256(ids.encode()).hexdigest()

    # -- Gymnasium API ---------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset the inner env to the next state of the round (or the last, on repeat).

        Options:
            repeat: True restores the last curriculum state again.
            state_id: reset to exactly this state, outside the curriculum.
        """
        options = dict(options or {})
        repeat = bool(options.pop("repeat", False))
        if options.get("state_id") is not None:
            if repeat:
                raise ValueError("pass either repeat=True or a state_id, not both")
            return self.env.reset(seed=seed, options=options)
        if "track" in options:
            raise ValueError(
                "the curriculum picks the state, so reset option 'track' does not apply; "
                "filter the states (states=...) instead"
            )
        if repeat:
            if self._last is None or self._last_where is None:
                raise ValueError("reset(options={'repeat': True}) needs an earlier reset to repeat")
            row, where = self._last, self._last_where
        else:
            if self._cursor >= len(self._round):
                self._round_index += 1
                self._build()
            row = self._round[self._cursor]
            spec = self._spec
            where = {
                "round": self._round_index,
                "batch": self._cursor // spec.batch_size,
                "index": self._cursor % spec.batch_size,
                "pool": row.pool,
                "target": row.target,
            }
            self._cursor += 1
            self._last, self._last_where = row, where
        obs, info = self.env.reset(seed=seed, options={**options, "state_id": row.state_id})
        return obs, {**info, "curriculum": dict(where)}

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env unchanged."""
        return self.env.step(action)

    # -- resuming --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the curriculum stands, as plain JSON-able data.

        A wrapper over the same states that loads it continues with exactly the same
        next state ids (and ``repeat`` repeats the same state).
        """
        return {
            "version": _STATE_VERSION,
            "spec": self._spec.model_dump(),
            "round": self._round_index,
            "cursor": self._cursor,
            "last": None if self._last is None else self._last.model_dump(mode="json"),
            "last_where": None if self._last_where is None else dict(self._last_where),
            "rows_sha256": self._rows_digest(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; its spec replaces this wrapper's.

        Raises:
            ValueError: the dict is of another version, or was saved over other states
                (the next state ids would differ).
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"expected a StageCurriculum state dict of version {_STATE_VERSION}, "
                f"got version {state.get('version')!r}"
            )
        if state["rows_sha256"] != self._rows_digest():
            raise ValueError(
                "the state dict was saved over other states (their ids differ from this "
                "wrapper's); load it into a wrapper over the same bank"
            )
        spec = RoundSpec.model_validate(state["spec"])
        self._spec = spec
        self._round_index = int(state["round"])
        self._build()
        cursor = int(state["cursor"])
        if not 0 <= cursor <= len(self._round):
            raise ValueError(f"expected a cursor in [0, {len(self._round)}], got {cursor}")
        self._cursor = cursor
        self._last = None if state["last"] is None else RLRow.model_validate(state["last"])
        self._last_where = None if state["last_where"] is None else dict(state["last_where"])
