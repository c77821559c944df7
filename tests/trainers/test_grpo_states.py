"""GRPO's state samplers: a curriculum round's ids come without restoring a sandbox."""

import json

import pytest

pytest.importorskip("torch")

from bat_gym.curriculum.wrapper import StageCurriculum  # noqa: E402
from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.trainers.grpo.states import CurriculumStates, SampledState  # noqa: E402


def test_drawing_a_rounds_ids_resets_no_env_and_restores_no_sandbox(toy, toy_bank, monkeypatch):
    resets = []
    monkeypatch.setattr(StageEnv, "reset", lambda self, **kw: resets.append(kw))
    env = StageEnv("E2E", benchmark=toy, states=toy_bank)
    reference = StageCurriculum(env, target="S2", seed=4, batches=2)
    expected = [(r.state_id, r.pool) for r in reference.current_round]

    states = CurriculumStates(StageCurriculum(env, target="S2", seed=4, batches=2))
    drawn = states.next(5)
    saved = json.loads(json.dumps(states.state_dict()))
    drawn += states.next(11)
    assert drawn == [SampledState(*e) for e in expected]
    assert resets == [] and env.sandbox is None  # ids come from the states' metadata

    resumed = CurriculumStates(StageCurriculum(env, target="S1", batches=2))
    resumed.load_state_dict(saved)
    assert resumed.next(11) == drawn[5:]
    assert resets == [] and env.sandbox is None
    states.close()
