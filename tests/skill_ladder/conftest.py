"""Fixtures for skill_ladder: the registered benchmark, a bank, and held-out stage states."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bat_gym.bank import build_bank, fit_history, task_states
from bat_gym.bank.states import MemoryStates
from bat_gym.benchmark import TeacherTurn
from bat_gym.catalog import get_benchmark, register_benchmark, unregister_benchmark
from bat_gym.core.protocol import get_protocol
from bat_gym.core.sandbox import BlobStore
from bat_gym.core.spec import E2E
from bat_gym.env import StageEnv
from bat_gym.envs.skill_ladder import SkillLadder
from bat_gym.rubrics.verifier.reward import RubricReward
from bat_gym.rubrics.verifier.verdict import Verdict

TRACKS = ("units", "cases", "codes")
HELDOUT = 1_000_000  # the first held-out seed
HERMES = get_protocol("hermes")


@pytest.fixture(scope="session")
def ladder() -> Iterator[SkillLadder]:
    """The benchmark, registered by name as its entry point would register it."""
    register_benchmark("skill_ladder", "bat_gym.envs.skill_ladder:benchmark")
    try:
        yield get_benchmark("skill_ladder")
    finally:
        unregister_benchmark("skill_ladder")


@pytest.fixture(scope="session")
def ladder_bank(ladder, tmp_path_factory):
    """One training task per track, every outcome: 3 tracks x 3 outcomes x 6 focuses."""
    return build_bank(
        ladder,
        tmp_path_factory.mktemp("bank") / "ladder",
        tasks_per_track=1,
        outcomes=("success", "recovery", "failure"),
    )


States = MemoryStates
"""A StateSource over states in memory (held-out rows never go into a bank)."""


def render(turn: TeacherTurn) -> str:
    return HERMES.render(turn.content, list(turn.calls))


def heldout_states(bench: SkillLadder, track: str, seed: int, root: Path) -> States:
    """The E2E start state of a held-out task and its stage states, cut as a bank cuts them.

    The success teacher is replayed in a real sandbox; before each stage's first turn
    the workspace is captured and the prompt rebuilt for that stage.
    """
    store = BlobStore(root / "store")
    start = task_states(bench, [(track, seed)], "heldout", store).get(
        f"{bench.task_id(track, seed, 'heldout')}.{E2E}.success"
    )
    task = bench.task_of_state(start)
    states = [start]
    env = StageEnv(E2E, benchmark=bench, states=States(store, [start]))
    try:
        env.reset(options={"state_id": start.state_id})
        current = None
        for turn in bench.teacher_turns(task):
            if turn.stage != current:
                current = turn.stage
                head = (
                    {"role": "system", "content": bench.system_prompt(current, HERMES)},
                    {"role": "user", "content": bench.user_prompt(task, current)},
                )
                room = bench.spec.budgets.max_prompt_chars - sum(len(m["content"]) for m in head)
                states.append(
                    start.model_copy(
                        update={
                            "state_id": f"{task.task_id}.{current}.success",
                            "focus": current,
                            "messages": (*head, *fit_history(env.messages[2:], room)),
                            "snapshot": env.sandbox.capture().digest,
                            "contract": bench.contract_ref(current),
                        }
                    )
                )
            env.step(render(turn))
    finally:
        env.close()
    return States(store, states)


def play(env: RubricReward, state_id: str, turns: list[TeacherTurn]) -> Verdict:
    """Reset ``env`` to a state, step ``turns`` until the episode ends; the verdict."""
    env.reset(options={"state_id": state_id})
    for turn in turns:
        _, _, terminated, truncated, info = env.step(render(turn))
        if terminated or truncated:
            return info["verdict"]
    raise AssertionError("the turns never ended the episode")


def from_stage(turns: list[TeacherTurn], focus: str) -> list[TeacherTurn]:
    """The turns a stage row plays: from its stage's first turn on (all of them for E2E)."""
    if focus == E2E:
        return turns
    return turns[next(i for i, t in enumerate(turns) if t.stage == focus) :]
