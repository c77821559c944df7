"""Model-free heuristics on the report track against the teacher and the naive floor."""

import pytest

from bat_gym.envs.medbench_lite.heuristics import heuristics

from ._heuristic_bound import bound, tier_scores

TRACK = "report"
# The five evaluation seeds per tier (a task holds only a handful of nodules and its
# fissures are its own, so fewer tasks are too noisy to judge a mean by); the slow
# sweep takes ten.
SEEDS = {
    "easy": tuple(range(1_000_000, 1_000_010, 2)),
    "hard": tuple(range(1_000_001, 1_000_011, 2)),
}
SWEEP = {
    "easy": tuple(range(1_000_000, 1_000_020, 2)),
    "hard": tuple(range(1_000_001, 1_000_021, 2)),
}


def test_the_track_has_heuristics():
    assert heuristics(TRACK), "no model-free heuristic to hold to the bound"


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_the_teacher_beats_every_heuristic(bench, tier):
    scores = tier_scores(bench, TRACK, SEEDS[tier])
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= scores["teacher"] + 1e-9, (tier, name, scores)


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_heuristics_score_at_most_half_the_teachers_margin_over_naive(bench, tier):
    scores = tier_scores(bench, TRACK, SEEDS[tier])
    limit = bound(scores)
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= limit, (tier, name, round(value, 3), round(limit, 3), scores)


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_heuristics_stay_within_the_bound_over_ten_seeds(bench, tier):
    scores = tier_scores(bench, TRACK, SWEEP[tier])
    limit = bound(scores)
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= limit, (tier, name, round(value, 3), round(limit, 3), scores)


def test_every_task_moves_its_fissures_off_the_textbook_and_its_model_carries_them(bench):
    from bat_gym.envs.medbench_lite.tracks import get_track
    from bat_gym.envs.medbench_lite.tracks.report import _SPREAD, TEXTBOOK

    track = get_track(TRACK)
    for seed in range(1_000_000, 1_000_010):
        fissures = track.fissures(seed, "heldout")
        weights = bench.draw(TRACK, seed, "heldout").weights
        assert tuple(weights["right_fissures"]) == fissures["right"]
        assert tuple(weights["left_fissure"]) == fissures["left"]
        spreads = {
            "right": (_SPREAD["a"], _SPREAD["b"], _SPREAD["horizontal"]),
            "left": (_SPREAD["a"], _SPREAD["b"]),
        }
        for side, values in fissures.items():
            for value, book, spread in zip(values, TEXTBOOK[side], spreads[side], strict=True):
                # At least half the spread away: a textbook reader is off on every task.
                assert 0.5 * spread - 1e-3 <= abs(value - book) <= spread + 1e-3, (seed, side)


def test_a_nodules_lobe_follows_the_tasks_fissures_not_the_textbook():
    import numpy as np

    from bat_gym.envs.medbench_lite.tracks.report import _LUNG, _LUNG_R, _lobe_of

    cx, cy, cz = _LUNG["left"]
    # A point at mid-depth, at zf = 0.45: below the textbook oblique fissure (0.52) ...
    point = np.array([cx, cy, cz - _LUNG_R[2] + 0.45 * 2 * _LUNG_R[2]])
    assert _lobe_of(point, "left")[0] == "left lower lobe"
    # ... and above a task's fissure drawn lower.
    low = {"right": (0.3, -0.8, 0.6), "left": (0.35, -0.8)}
    assert _lobe_of(point, "left", low)[0] == "left upper lobe"
