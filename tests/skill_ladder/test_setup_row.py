"""A Setup row is won by Setup's work alone, and only by it.

skill_ladder's pipeline reads the flag the S3 pilot chooses (``validation/settings.json``).
The verifier runs the pipeline a Setup row leaves with the later stages' artifacts as the
reference run left them: so ``setup`` then ``finish`` wins the row on every track, a
pipeline that does not compute the model's outputs still earns nothing, and settings an
S2 episode writes beyond its stage neither help nor hurt.
"""

from __future__ import annotations

import pytest

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.protocol import ToolCall
from bat_gym.env import StageEnv
from bat_gym.rubrics.verifier.reward import RubricReward

from .conftest import HELDOUT, TRACKS, heldout_states, play

SETTINGS = "validation/settings.json"


def sh(code: str) -> TeacherTurn:
    return TeacherTurn(
        "S2", "", (ToolCall(name="execute_code", arguments={"language": "bash", "code": code}),)
    )


def done() -> TeacherTurn:
    return TeacherTurn("S2", "", (ToolCall(name="finish", arguments={"summary": "done"}),))


@pytest.fixture(scope="module", params=TRACKS)
def setup_row(request, ladder, tmp_path_factory):
    """The held-out Setup row of one track, and an S2 env over it."""
    states = heldout_states(ladder, request.param, HELDOUT, tmp_path_factory.mktemp("s2"))
    (state_id,) = [s for s in states.select(focus="S2")]
    env = RubricReward(StageEnv("S2", benchmark=ladder, states=states))
    yield env, state_id
    env.close()


def _items(verdict) -> dict[str, bool | None]:
    return {i.id: i.passed for s in verdict.stages for i in s.items}


def test_setup_then_finish_wins_the_setup_row_on_every_track(setup_row):
    env, state_id = setup_row
    verdict = play(env, state_id, [sh("python tool/pipe.py setup"), done()])
    # Before the later stages' settings came from the reference run, the cases and
    # codes tracks paid 0 here: the pipeline ran with the default flag.
    assert verdict.reward == 1.0, verdict.notes
    assert _items(verdict)["pipeline_works"] is True


def test_a_pipeline_that_is_not_the_model_still_earns_nothing(setup_row):
    env, state_id = setup_row
    fake = (
        "python tool/pipe.py setup\n"
        'printf \'import sys\\nopen(sys.argv[1], "w").write("id,label\\\\n")\\n\''
        " > pipeline/infer.py"
    )
    verdict = play(env, state_id, [sh(fake), done()])
    assert verdict.reward == 0.0
    assert _items(verdict)["pipeline_works"] is False


def test_settings_written_beyond_the_stage_are_the_reference_runs_in_the_reproduction(
    setup_row,
):
    env, state_id = setup_row
    # A bogus flag, and a file where the settings' folder should be: neither changes
    # what the verifier's run of the pipeline starts from.
    for mess in (
        f'mkdir -p validation && echo \'{{"unit": "furlong"}}\' > {SETTINGS}',
        "rm -rf validation && echo not-a-folder > validation",
    ):
        verdict = play(env, state_id, [sh(f"python tool/pipe.py setup\n{mess}"), done()])
        assert _items(verdict)["pipeline_works"] is True, verdict.notes
