"""Model-free heuristics on the enhancement track against the teacher and the naive floor."""

import pytest

from bat_gym.envs.medbench_lite.heuristics import heuristics

from ._heuristic_bound import bound, tier_scores

TRACK = "enhancement"
# One held-out seed per tier keeps the default run short; the slow sweep takes five.
SEEDS = {"easy": (1_000_000,), "hard": (1_000_001,)}
SWEEP = {
    "easy": tuple(range(1_000_000, 1_000_010, 2)),
    "hard": tuple(range(1_000_001, 1_000_011, 2)),
}


def test_the_track_has_heuristics():
    assert heuristics(TRACK), "no model-free heuristic to hold to the bound"


@pytest.mark.xfail(
    strict=False,
    reason="open: a wider textbook bilateral filter (7 x 7, heuristic bilateral_7x7) beats the provided model on held-out noise",
)
@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_the_teacher_beats_every_heuristic(bench, tier):
    scores = tier_scores(bench, TRACK, SEEDS[tier])
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= scores["teacher"] + 1e-9, (tier, name, scores)


@pytest.mark.xfail(
    strict=False,
    reason="open: the model is a textbook bilateral filter, which a reader writes from scratch (heuristic bilateral_5x5 scores what the teacher scores) and a Gaussian blur closes about 0.5 of the SSIM gap; the degradation carries nothing only the model knows",
)
@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_heuristics_score_at_most_half_the_teachers_margin_over_naive(bench, tier):
    scores = tier_scores(bench, TRACK, SEEDS[tier])
    limit = bound(scores)
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= limit, (tier, name, round(value, 3), round(limit, 3), scores)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,
    reason="open: the model is a textbook bilateral filter, which a reader writes from scratch (heuristic bilateral_5x5 scores what the teacher scores) and a Gaussian blur closes about 0.5 of the SSIM gap; the degradation carries nothing only the model knows",
)
@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_heuristics_stay_within_the_bound_over_five_seeds(bench, tier):
    scores = tier_scores(bench, TRACK, SWEEP[tier])
    limit = bound(scores)
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= limit, (tier, name, round(value, 3), round(limit, 3), scores)
