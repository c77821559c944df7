"""StageCurriculum: a wrapper whose ``reset()`` walks an RL round of stage states.

Any trainer that drives a Gymnasium env gets the Benchmark-as-Teacher curriculum by
wrapping the env: every ``reset()`` restores the state its
:class:`~bat_gym.curriculum.sampler.CurriculumSampler` draws next, and ``step()`` is
untouched. A trainer that only needs the ids (GRPO) asks :attr:`StageCurriculum.sampler`
and restores no sandbox to get them.

>>> import gymnasium as gym
>>> env = StageCurriculum(gym.make("bat/E2E-v0", states=bank), target="S2")  # doctest: +SKIP
>>> obs, info = env.reset()  # doctest: +SKIP
>>> info["curriculum"]  # doctest: +SKIP
{'round': 0, 'batch': 0, 'index': 0, 'pool': 'target', 'target': 'S2'}
>>> obs, info = env.reset(options={"repeat": True})  # same state: a GRPO group # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym

from bat_gym.core.errors import CurriculumError, NotAStageEnv
from bat_gym.curriculum.rounds import RLRow, RoundSpec
from bat_gym.curriculum.sampler import CurriculumSampler
from bat_gym.env import StageEnv

__all__ = ["StageCurriculum"]


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
            fill a round's pools (see :func:`~bat_gym.curriculum.rounds.build_round`).
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
        gym.Wrapper.__init__(self, env)
        # Validated now, so a bad composition fails at construction, not mid-training.
        spec = RoundSpec(
            target=self._stage_id(target),
            batch_size=batch_size,
            target_per_batch=target_per_batch,
            mix_per_batch=mix_per_batch,
            e2e_per_batch=e2e_per_batch,
            batches=batches,
            seed=seed,
        )
        gym.utils.RecordConstructorArgs.__init__(
            self, target=target, states=states, **spec.model_dump(exclude={"target"})
        )
        self.sampler = CurriculumSampler.from_source(
            states if states is not None else self.env.unwrapped.states, spec
        )
        """Draws the state ids; it reads the states' metadata only, never a sandbox."""

    # -- the round -----------------------------------------------------------------

    @property
    def target(self) -> str:
        """The current target stage id."""
        return self.sampler.target

    @property
    def round_spec(self) -> RoundSpec:
        """The spec of the current round (its seed is ``seed + round index``)."""
        return self.sampler.round_spec

    @property
    def round_index(self) -> int:
        """How many rounds were started before the current one."""
        return self.sampler.round_index

    @property
    def current_round(self) -> list[RLRow]:
        """The current round's rows, batch after batch."""
        return self.sampler.current_round

    def upcoming(self, n: int) -> list[str]:
        """The state ids of the next ``n`` curriculum resets of this round (fewer at its end)."""
        return self.sampler.upcoming(n)

    def set_target(self, stage: str) -> None:
        """Switch to a new target stage (id or name) and start a new round for it."""
        self.sampler.set_target(self._stage_id(stage))

    def _stage_id(self, stage: str) -> str:
        focus = self.env.unwrapped.benchmark.spec.focus(stage)
        if focus == "E2E":
            raise CurriculumError(
                "target must be a stage (S1, S2, ...; or its name), got 'E2E': E2E states "
                "are their own pool in every batch (e2e_per_batch)"
            )
        return focus

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
        if repeat and self.sampler.last is None:
            raise ValueError("reset(options={'repeat': True}) needs an earlier reset to repeat")
        row, where = self.sampler.last if repeat else self.sampler.draw()
        obs, info = self.env.reset(seed=seed, options={**options, "state_id": row.state_id})
        return obs, {**info, "curriculum": dict(where)}

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env unchanged."""
        return self.env.step(action)

    # -- resuming --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the curriculum stands, as plain JSON-able data (the sampler's state).

        A wrapper over the same states that loads it continues with exactly the same
        next state ids (and ``repeat`` repeats the same state).
        """
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; its spec replaces this wrapper's.

        Raises:
            CurriculumError: the dict is of another version, or was saved over other
                states (the next state ids would differ).
        """
        self.sampler.load_state_dict(state)
