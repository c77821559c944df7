"""MedBench-Lite through the real stack: a Stage Bank built by replaying the teacher, and
StageEnv episodes started from it."""

import pytest

from bat_gym.bank import build_bank
from bat_gym.core.protocol import get_protocol
from bat_gym.env import StageEnv

from .conftest import NAIVE_MAX, TEACHER_MIN, TRACKS

HERMES = get_protocol("hermes")


@pytest.fixture(scope="module")
def bank(bench, tmp_path_factory):
    return build_bank(bench, tmp_path_factory.mktemp("medbench") / "bank", tasks_per_track=1)


def _task(bench, bank, state):
    return bench.make_task(state.track, state.provenance["seed"], "train")


def _play(env, turns):
    terminated = False
    for turn in turns:
        _, _, terminated, truncated, _ = env.step(HERMES.render(turn.content, list(turn.calls)))
        assert not truncated
    return terminated


@pytest.mark.slow
def test_bank_rows_cover_every_focus_and_track_with_earlier_artifacts_only(bench, bank):
    assert {(s.focus, s.track) for s in bank} == {
        (f, t) for f in bench.spec.focuses for t in TRACKS
    }
    stages = bench.spec.stages
    for state in bank:
        if state.focus == "E2E":
            continue
        snap = bank.store.get_snapshot(state.snapshot)
        files = {e.path for e in snap.entries if e.kind == "f"}
        k = [s.id for s in stages].index(state.focus)
        for earlier in stages[:k]:
            assert set(earlier.artifacts) <= files, (state.state_id, earlier.id)
        for later in stages[k:]:
            assert not set(later.artifacts) & files, (state.state_id, later.id)


@pytest.mark.slow
@pytest.mark.parametrize("track", TRACKS)
def test_e2e_episode_teacher_scores_and_naive_does_not(bench, bank, track):
    env = StageEnv("E2E", benchmark=bench, states=bank, track=track)
    try:
        env.reset(seed=0)
        task = _task(bench, bank, env.state)
        assert _play(env, bench.teacher_turns(task))
        assert all(c.exit_code == 0 for c in env.record.calls)
        assert bench.score_directory(task, env.sandbox.workspace) >= TEACHER_MIN[track]
        env.reset(seed=0)
        assert _play(env, bench.naive_turns(task))
        assert bench.score_directory(task, env.sandbox.workspace) <= NAIVE_MAX[track]
    finally:
        env.close()


@pytest.mark.slow
def test_a_validate_row_resumes_from_s2_files(bench, bank):
    env = StageEnv("Validate", benchmark=bench, states=bank, track="detection")
    try:
        env.reset(seed=0)
        task = _task(bench, bank, env.state)
        rest = [t for t in bench.teacher_turns(task) if t.stage in ("S3", "S4", "S5")]
        assert _play(env, rest)
        assert bench.score_directory(task, env.sandbox.workspace) >= TEACHER_MIN["detection"]
    finally:
        env.close()
