"""Real episodes in a sandbox, scored by the reference contracts, on held-out tasks."""

import pytest

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.spec import E2E
from bat_gym.env import StageEnv
from bat_gym.envs.skill_ladder.tasks import draw
from bat_gym.envs.skill_ladder.teacher import PILOT, right_flag, sh
from bat_gym.rubrics.verifier.reward import RubricReward

from .conftest import HELDOUT, TRACKS, from_stage, heldout_states, play


@pytest.fixture(scope="module", params=TRACKS)
def heldout(request, ladder, tmp_path_factory):
    """A held-out task of each track: its states, task and an E2E env over them."""
    track = request.param
    states = heldout_states(ladder, track, HELDOUT, tmp_path_factory.mktemp(track))
    env = RubricReward(StageEnv(E2E, benchmark=ladder, states=states))
    task = ladder.task_of_state(states.get(states.select(focus=E2E)[0]))
    yield track, states, task, env
    env.close()


def _credits(verdict):
    return {s.stage: s.credit for s in verdict.stages}


def test_the_teacher_scores_at_least_095_on_every_focus(ladder, heldout):
    track, states, task, env = heldout
    turns = ladder.teacher_turns(task)
    durations = []
    for focus in ladder.spec.focuses:
        (sid,) = states.select(focus=focus)
        verdict = play(env, sid, from_stage(turns, focus))
        durations += [c.duration_s for c in env.unwrapped.record.calls if c.succeeded]
        assert verdict.reward >= 0.95, (track, focus, verdict.notes, _credits(verdict))
        if focus == E2E:
            assert verdict.task_score == 1.0
            assert all(c == 1.0 for c in _credits(verdict).values()), _credits(verdict)
    # Each call is one short python start (about 50 ms); the bound leaves room for load.
    assert len(durations) >= 20 and max(durations) < 1.0, durations


def test_the_naive_baseline_is_clearly_lower(ladder, heldout):
    track, states, task, env = heldout
    (sid,) = states.select(focus=E2E)
    naive = play(env, sid, ladder.naive_turns(task))
    # No plan, no pilot: S1 and S3 earn nothing, so the stage part is at most 0.4.
    assert naive.reward <= 0.7 and naive.stage_score <= 0.4 + 1e-9, (track, naive.reward)
    assert _credits(naive)["S3"] == 0.0


def _with_pilot(ladder, task, flag: str) -> list[TeacherTurn]:
    """The success teacher with its pilot replaced by one pilot using ``flag``."""
    turns = [t for t in ladder.teacher_turns(task) if t.stage != "S3"]
    at = next(i for i, t in enumerate(turns) if t.stage == "S4")
    return [*turns[:at], TeacherTurn("S3", "Pilot.", (sh(f"{PILOT} {flag}".strip()),)), *turns[at:]]


def _wrong_flags(track, d):
    if track == "units":
        return ["--unit " + ("cm" if d.choice == "mm" else "mm")]
    if track == "cases":
        return ["", f"--case {d.case_ids[-1]}"]  # the default (first) case, and another one
    return ["", "--codes " + ("legacy" if d.choice == "lower" else "lower")]


def test_a_wrong_flag_costs_s3_credit_and_task_score(ladder, heldout):
    track, states, task, env = heldout
    d = draw(track, HELDOUT)
    right = _with_pilot(ladder, task, right_flag(d))
    (e2e,) = states.select(focus=E2E)
    (s3,) = states.select(focus="S3")
    good = play(env, e2e, right)
    assert (good.reward, good.task_score, _credits(good)["S3"]) == (1.0, 1.0, 1.0)
    assert play(env, s3, from_stage(right, "S3")).reward == 1.0
    for flag in _wrong_flags(track, d):
        wrong = _with_pilot(ladder, task, flag)
        bad = play(env, e2e, wrong)
        # Ran and receipted, but its rows are not the model's outputs under the right
        # flag (the reference run's), so the guards zero the stage.
        assert _credits(bad)["S3"] == 0.0, (flag, bad.notes)
        # reward = 0.5 * task + 0.5 * (1 - 0.35) <= 0.5 * 2/3 + 0.325
        assert bad.task_score <= 2 / 3 and bad.reward <= 0.66, (flag, bad.reward)
        assert play(env, s3, from_stage(wrong, "S3")).reward == 0.0, flag


def test_recovery_reads_the_failed_check_and_failure_keeps_the_mistake(ladder, heldout):
    track, states, task, env = heldout
    (e2e,) = states.select(focus=E2E)
    recovered = play(env, e2e, ladder.teacher_turns(task, "recovery"))
    pilots = [c for c in env.unwrapped.record.calls if "validation/pilot.csv" in c.code]
    assert (
        len(pilots) == 2 and "CHECK FAILED" in pilots[0].output and "CHECK OK" in pilots[1].output
    )
    assert recovered.reward == 1.0
    failed = play(env, e2e, ladder.teacher_turns(task, "failure"))
    assert _credits(failed)["S3"] == 0.0 and failed.task_score <= 2 / 3
    assert failed.reward < recovered.reward - 0.25
