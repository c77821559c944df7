"""RubricReward: the verifier as a reward wrapper around a StageEnv.

Intermediate steps earn 0. When an episode ends (terminated or truncated) the wrapper
freezes the workspace (:meth:`bat_gym.core.sandbox.Sandbox.freeze`), loads the state's
contract from the benchmark's library (refused unless its digest equals the one the
state pins), verifies from outside the sandbox, returns the reward on that final step
and puts the :class:`~bat_gym.rubrics.verifier.verdict.Verdict` in ``info["verdict"]``.

A workspace the host refuses (the env's :attr:`~bat_gym.env.StageEnv.rejection`, or
a :class:`~bat_gym.core.errors.WorkspaceRejected` from the freeze: an escaping link, a name
no manifest can hold, a workspace past its quota) is the agent's doing: the verdict is
a zero with that category in :attr:`~bat_gym.rubrics.verifier.verdict.Verdict.rejected`,
never an exception.

``gym.make("bat/...-v0")`` applies it through :func:`make_env`; pass
``rubric_reward=False`` for the bare env. The ids also end their wrapper stack with
:class:`TruncationVerdict`, so an episode that ``gym.make(..., max_episode_steps=N)``
(Gymnasium's ``TimeLimit``, applied outside the entry point's wrappers) truncates is
scored like one the env's own budgets truncate.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym

from bat_gym.core.errors import NotAStageEnv, ResetNeeded, RubricContractError, WorkspaceRejected
from bat_gym.core.sandbox.snapshot import without_paths
from bat_gym.env import StageEnv
from bat_gym.rubrics.contract.context import CheckContext
from bat_gym.rubrics.contract.model import ContractLibrary
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reference import adopt_reference, task_oracle
from bat_gym.rubrics.verifier.verdict import Verdict, rejected_verdict, verify

__all__ = ["RubricReward", "TruncationVerdict", "make_env"]


class RubricReward(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Reward a StageEnv episode with its rubric contract's verdict, once, at the end.

    Args:
        env: a :class:`~bat_gym.env.StageEnv`, or a wrapper around one.
        contracts: the library to load contracts from; default: the benchmark's
            (:meth:`~bat_gym.benchmark.Benchmark.contract_library`).

    The final step's reward is the verdict's reward, or 0.0 when the verdict is null
    (``info["verdict"].reward is None``: drop such rollouts rather than learn from 0).
    """

    def __init__(self, env: gym.Env[str, str], *, contracts: ContractLibrary | None = None) -> None:
        if not isinstance(env.unwrapped, StageEnv):
            raise NotAStageEnv(
                f"RubricReward scores StageEnv episodes; expected an env whose unwrapped is a "
                f"StageEnv, got {type(env.unwrapped).__name__}"
            )
        gym.utils.RecordConstructorArgs.__init__(self, contracts=contracts)
        gym.Wrapper.__init__(self, env)
        self.contracts = contracts
        self.last_verdict: Verdict | None = None

    @property
    def spec(self) -> Any:
        """The env's spec, without this wrapper in ``additional_wrappers``.

        :func:`make_env` applies (or, with ``rubric_reward=False``, leaves out) this
        wrapper from the id's own keyword arguments, so recreating the env from its spec
        must not add it a second time; and the ids' registered
        :class:`TruncationVerdict` follows Gymnasium's ``TimeLimit`` only when the
        entry point's wrappers are not listed as applied before it.
        """
        return self.env.spec

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset the env and forget the last verdict."""
        self.last_verdict = None
        return self.env.reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step; on the episode's last step, verify and return the reward."""
        obs, _, terminated, truncated, info = self.env.step(action)
        if not (terminated or truncated):
            return obs, 0.0, terminated, truncated, info
        verdict = self.score_episode()
        self.last_verdict = verdict
        reward = 0.0 if verdict.reward is None else verdict.reward
        return obs, reward, terminated, truncated, {**info, "verdict": verdict}

    def score_episode(self) -> Verdict:
        """Freeze the workspace and verify the episode so far against the state's contract.

        Raises:
            RubricContractError: the state pins a contract the library does not hold
                with the same digest, or there is no contract for its focus.
        """
        base: StageEnv = self.env.unwrapped  # type: ignore[assignment]
        state, record, sandbox = base.state, base.record, base.sandbox
        if state is None or record is None or sandbox is None:
            raise ResetNeeded("score_episode() needs an episode: call reset() first")
        library = self.contracts or base.benchmark.contract_library()
        ref = state.contract or base.benchmark.contract_ref(state.focus)
        if ref is None:
            raise RubricContractError(
                f"<{state.focus}>",
                f"state {state.state_id} pins no contract and {base.benchmark.name} has none "
                f"for focus {state.focus}; add one to the benchmark's contract library",
            )
        contract = library.get(ref)
        try:
            if base.rejection is not None:
                raise base.rejection
            final = sandbox.freeze()
        except WorkspaceRejected as exc:
            return rejected_verdict(contract, exc, library=library)
        # What changed after the last call returned is nobody's work: it is not scored.
        base.note_unattributed(final)
        final = without_paths(final, frozenset(record.unattributed))
        task = base.benchmark.task_of_state(state)
        workspace = FrozenWorkspace(final, sandbox.frozen_store)
        if task is not None:  # the teacher's own run on the pristine task is the reference
            adopt_reference(
                base.benchmark,
                task,
                state.snapshot,
                [(c.language, c.code, c.exit_code) for c in record.calls],
                workspace,
                backend=base.backend,
                unattributed=record.unattributed,
            )
        ctx = CheckContext(
            workspace=workspace,
            start=FrozenWorkspace.load(base.states.store, state.snapshot),
            record=record,
            task=None if task is None else task_oracle(base.benchmark, task, backend=base.backend),
            spec=base.benchmark.spec,
        )
        return verify(contract, ctx, library=library)


class TruncationVerdict(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Score an episode that a wrapper outside the rubric truncated.

    ``RubricReward`` scores when the env's own budgets end an episode; a ``TimeLimit``
    applied around it (``gym.make(id, max_episode_steps=N)``) truncates a step that the
    rubric took for an intermediate one, which would leave the episode with reward 0
    and no verdict. Around such a stack, this wrapper scores that step with the
    enclosed :class:`RubricReward` (its reward and ``info["verdict"]``), as the env's
    own truncation would. Without a ``RubricReward`` inside it passes steps through.

    The ``bat/*`` ids apply it last. Around your own ``TimeLimit``, wrap it yourself::

        env = TruncationVerdict(TimeLimit(gym.make("bat/S3-v0"), 5))  # doctest: +SKIP
    """

    def __init__(self, env: gym.Env[str, str]) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step; when an outer wrapper truncated an unscored episode, score it."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if truncated and not terminated and "verdict" not in info:
            rubric = _rubric_inside(self.env)
            if rubric is not None:
                verdict = rubric.score_episode()
                rubric.last_verdict = verdict
                reward = 0.0 if verdict.reward is None else verdict.reward
                info = {**info, "verdict": verdict}
        return obs, reward, terminated, truncated, info


def _rubric_inside(env: gym.Env[str, str]) -> RubricReward | None:
    """The RubricReward in ``env``'s wrapper stack, or None."""
    while not isinstance(env, RubricReward):
        env = getattr(env, "env", None)  # type: ignore[assignment]
        if env is None:
            return None
    return env


def make_env(stage: str = "E2E", *, rubric_reward: bool = True, **kwargs: Any) -> gym.Env[str, str]:
    """The entry point of the ``bat/*`` ids: a StageEnv, wrapped in RubricReward by default.

    Args:
        stage: the focus, as for :class:`~bat_gym.env.StageEnv`.
        rubric_reward: False returns the bare StageEnv (reward always 0).
        **kwargs: every other keyword argument of StageEnv (unknown ones raise there).
    """
    env = StageEnv(stage, **kwargs)
    return RubricReward(env) if rubric_reward else env
