"""No model-free shortcut on the detection track comes near the teacher (see heuristic_bounds)."""

import pytest

from bat_gym.envs.medbench_lite.tracks.base import difficulty

from .heuristic_bounds import assert_bound

TRACK = "detection"


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_heuristics_stay_below_half_the_teachers_gain(bench, tier):
    assert_bound(bench, TRACK, [s for s in range(8) if difficulty(s) == tier])


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_heuristics_stay_below_half_the_teachers_gain_over_many_tasks(bench, tier):
    assert_bound(bench, TRACK, [s for s in range(8, 32) if difficulty(s) == tier])
