"""Teaching with any Policy: stage boundaries from artifacts, stored trajectories.

A free policy plays a task's E2E episode once (:func:`policy_trajectory`); its turns
are labelled by stage from the files in the workspace, not from the policy. The
recorded actions are stored with the rows as one blob (:func:`trajectory_blob`) and
read back by :func:`load_trajectory`, so a build, :meth:`~bat_gym.bank.StageBank.verify`
and :func:`~bat_gym.sft.sft_rows` replay the very same actions. A build's manifest
names the teacher by the policy's identity (:func:`teacher_identity`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bat_gym.bank.replay import RecordedTurn
from bat_gym.bank.states import MemoryStates
from bat_gym.benchmark import Benchmark
from bat_gym.core.completion import Completion
from bat_gym.core.errors import BankError
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import E2E, StageState
from bat_gym.rollout import SandboxRestarted, Step, policy_actor, run_episode

if TYPE_CHECKING:
    from bat_gym.policies.base import Policy

__all__ = [
    "POLICY_OUTCOMES",
    "load_trajectory",
    "policy_trajectory",
    "teacher_identity",
    "trajectory_blob",
]


POLICY_OUTCOMES: tuple[str, ...] = ("success", "failure")
"""The labels a policy teacher's trajectory can get from the verifier."""


def load_trajectory(store: BlobStore, state: StageState) -> list[RecordedTurn] | None:
    """The recorded actions a policy-taught row was built from, or None for a scripted row.

    Policy trajectories are stored as one JSON blob (``{"turns": [[stage, text,
    num_tokens], ...]}``) named by ``provenance["trajectory"]``; scripted rows are
    regenerated from the benchmark's teacher instead.
    """
    digest = state.provenance.get("trajectory")
    if not digest:
        return None
    data = json.loads(store.read_blob(digest))
    return [RecordedTurn(*t) for t in data["turns"]]


def trajectory_blob(turns: Sequence[RecordedTurn]) -> bytes:
    """A trajectory's canonical bytes, as stored with its rows (:func:`load_trajectory` reads them)."""
    return json.dumps(
        {"turns": [list(t) for t in turns]}, sort_keys=True, separators=(",", ":")
    ).encode()


def _files(env: Any) -> set[str]:
    """Workspace-relative paths of the files in ``env``'s sandbox now (nothing stored)."""
    return {e.path for e in env.sandbox.index.scan().entries if e.kind == "f"}


def _stage_reached(bench: Benchmark, current: int, files: set[str]) -> int:
    """The index of the stage a free policy is in, given the files that exist.

    Stage ``k + 1`` begins once every artifact of stages ``1..k`` exists (the files an
    earlier stage must leave in place for a stage row); stages are never revisited.
    """
    stages = bench.spec.stages
    k = current
    while k + 1 < len(stages) and all(a in files for s in stages[: k + 1] for a in s.artifacts):
        k += 1
    return k


def policy_trajectory(
    bench: Benchmark,
    policy: Policy,
    start: StageState,
    store: BlobStore,
    *,
    backend: str,
    protocol: str,
) -> tuple[list[RecordedTurn], dict[str, str], str | None]:
    """Let ``policy`` play ``start``'s E2E episode and label its turns by stage.

    A free policy does not say which stage a turn belongs to, so the boundaries are
    read from the workspace: after each turn the files are listed, and the next stage
    begins with the first turn after which every artifact of the earlier stages
    (``spec.stages[i].artifacts``) exists. A stage whose artifacts appear in the same
    turn as the previous stage's has no turn of its own, and so no row; a stage that
    declares no artifacts ends where it begins.

    Returns:
        The turns (stage, message, tokens), the workspace digest at the start of each
        stage that has turns, and a rejection reason (None when the policy finished).

    Raises:
        PolicyError: the policy's backend failed (the build stops; a rerun resumes).
        BankError: the sandbox crashed during a tool call.
    """
    from bat_gym.env import StageEnv

    env = StageEnv(
        E2E,
        benchmark=bench,
        states=MemoryStates(store, [start]),
        backend=backend,
        protocol=protocol,
    )
    stages = bench.spec.stages
    turns: list[RecordedTurn] = []
    ask = policy_actor(policy, bench, start)
    try:
        _, info = env.reset(options={"state_id": start.state_id})
        k = _stage_reached(bench, 0, _files(env))
        digests = {stages[k].id: env.sandbox.digest()}  # type: ignore[union-attr]

        def act(info: dict[str, Any]) -> Completion:
            action = ask(info)
            turns.append(RecordedTurn(stages[k].id, str(action), action.num_tokens))
            return action

        def after(step: Step) -> None:
            nonlocal k
            if step.done:
                return
            reached = _stage_reached(bench, k, _files(env))
            if reached != k:
                k = reached
                digests[stages[k].id] = env.sandbox.digest()  # type: ignore[union-attr]

        try:
            end = run_episode(env, act, info=info, on_step=after)
        except SandboxRestarted as exc:
            # Infrastructure, not the policy's doing: stop rather than journal a verdict.
            raise BankError(
                start.state_id, "the sandbox crashed during a tool call; rerun"
            ) from exc
        reason = None if end.terminated else "teacher ran out of budget"
        return turns, digests, reason
    finally:
        env.close()


def teacher_identity(teacher: Policy | None) -> str | dict[str, Any]:
    """``"scripted"``, or the policy's identity (what reproduces it, no secrets)."""
    return "scripted" if teacher is None else {"policy": teacher.identity()}
