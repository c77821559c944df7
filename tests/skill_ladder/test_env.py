"""The Stage Bank of skill_ladder, its envs under Gymnasium's checker, and its audit."""

import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from bat_gym.audits.leakage import audit_bank
from bat_gym.core.spec import E2E
from bat_gym.env import StageEnv

from .conftest import TRACKS


def test_the_bank_holds_every_focus_track_and_outcome(ladder, ladder_bank):
    manifest = ladder_bank.manifest
    assert manifest["outcomes"] == ["success", "recovery", "failure"]
    assert manifest["rejected"] == {} and manifest["unsupported_outcomes"] == []
    assert len(ladder_bank) == len(TRACKS) * 3 * len(ladder.spec.focuses)
    for track in TRACKS:
        for focus in ladder.spec.focuses:
            outcomes = {ladder_bank.get(s).outcome for s in ladder_bank.select(focus, track)}
            assert outcomes == {"success", "recovery", "failure"}, (track, focus)
    s3 = ladder_bank.get(ladder_bank.select("S3", "cases")[0])
    assert [m["role"] for m in s3.messages][:2] == ["system", "user"]
    # A stage row resumes the E2E episode: the same prompt, the teacher's turns so far.
    e2e = ladder_bank.get(s3.state_id.replace(".S3.", ".E2E."))
    assert s3.messages[:2] == e2e.messages[:2]
    assert [m["role"] for m in s3.messages[2:]] == ["assistant", "tool"] * 2  # plan, setup


@pytest.mark.parametrize("focus", ["S1", "S2", "S3", "S4", "S5", E2E])
def test_every_focus_passes_check_env(ladder, ladder_bank, focus):
    env = StageEnv(focus, benchmark=ladder, states=ladder_bank)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_the_bank_holds_no_held_out_content(ladder, ladder_bank):
    report = audit_bank(ladder_bank, ladder)
    assert report.ok, report.table()


@pytest.mark.slow  # replays all nine trajectories: 4-7 s on two shared cores
def test_the_bank_verifies_by_replay(ladder, ladder_bank):
    report = ladder_bank.verify(bench=ladder)
    assert report.ok, report.table()
