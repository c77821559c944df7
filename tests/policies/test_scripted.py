import pytest

from bat_gym.core.errors import BatGymError
from bat_gym.env import StageEnv
from bat_gym.evaluation import play_episode
from bat_gym.policies import EpisodeContext, PolicyRequest, ScriptedPolicy, make_policy
from bat_gym.rubrics.verifier.reward import RubricReward


@pytest.mark.parametrize("focus", ["E2E", "S3", "S5"])
def test_the_teacher_solves_every_focus_from_its_state(toy, toy_bank, focus):
    env = RubricReward(StageEnv(focus, benchmark=toy, states=toy_bank))
    try:
        state = toy_bank.get(toy_bank.select(focus=focus)[0])
        info, finished = play_episode(env, make_policy("teacher"), state, toy)
        assert finished
        assert info["verdict"].reward == pytest.approx(1.0)
    finally:
        env.close()


def test_the_teacher_needs_the_episode_context():
    with pytest.raises(BatGymError, match="episode context"):
        ScriptedPolicy("teacher").act(PolicyRequest(messages=[], tools=[]))


def test_past_the_script_it_finishes(toy, toy_bank):
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    request = PolicyRequest([], [], EpisodeContext(benchmark=toy, state=state, turn=99))
    assert '"finish"' in ScriptedPolicy("teacher").act(request).text


def test_unknown_specs_and_outcomes_are_named(toy, toy_bank):
    with pytest.raises(ValueError, match="hf:PATH"):
        make_policy("gpt-4")
    with pytest.raises(ValueError, match="openai:URL#MODEL"):
        make_policy("openai:http://127.0.0.1:1/v1")
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    request = PolicyRequest([], [], EpisodeContext(benchmark=toy, state=state, turn=0))
    with pytest.raises(BatGymError, match="no teacher outcome"):
        make_policy("teacher:sideways").act(request)


def test_a_row_that_carries_a_mistake_plays_the_benchmarks_repair_turns(toy, toy_bank, monkeypatch):
    from bat_gym.benchmark import TeacherTurn
    from bat_gym.core.protocol import bash_call

    repair = [TeacherTurn("S4", "Repairing the pilot.", (bash_call("true"),))]
    asked = []

    def repair_turns(task, focus, outcome):
        asked.append((focus, outcome))
        return repair if outcome == "failure" else []

    monkeypatch.setattr(toy, "repair_turns", repair_turns, raising=False)
    clean = toy_bank.get(toy_bank.select(focus="S4")[0])
    defect = clean.model_copy(update={"outcome": "failure"})
    later = [t for t in toy.teacher_turns(toy.task_of_state(clean)) if t.stage == "S5"]

    def text(policy, state, turn):
        return policy.act(PolicyRequest([], [], EpisodeContext(toy, state, turn))).text

    teacher = ScriptedPolicy("teacher")
    # The repair replaces the stage's turns; the later stages' success turns follow.
    assert "Repairing the pilot." in text(teacher, defect, 0)
    assert later[0].content in text(teacher, defect, 1)
    assert asked == [("S4", "failure")] * 2
    # A clean row, and the naive baseline on any row, play their scripts as before.
    assert "Repairing" not in text(teacher, clean, 0)
    assert "Repairing" not in text(ScriptedPolicy("naive"), defect, 0)
