"""Model-free heuristics against the teacher and the naive floor, per track and tier.

Two families (see :mod:`.heuristic_bounds`):

* the 2D tracks (classification, detection, vqa) hold the bound on eight training
  tasks, four per tier, and on 24 more in the slow sweep;
* the volume tracks (segmentation, enhancement, synthesis, report) are scored on
  held-out seeds: the teacher beats every heuristic, and the bound holds.

A cell a change leaves open goes in ``OPEN`` with its reason (a non-strict expected
failure), so the table stays honest while it is worked on; none is open now.
"""

import pytest

from bat_gym.envs.medbench_lite.heuristics import heuristics
from bat_gym.envs.medbench_lite.tracks.base import difficulty

from .heuristic_bounds import assert_bound, bound, tier_scores

TIERS = ("easy", "hard")
TRAIN_TRACKS = ("classification", "detection", "vqa")
HELDOUT_TRACKS = ("segmentation", "enhancement", "synthesis", "report")

# One held-out seed per tier keeps the default run short; the slow sweep takes five.
_ONE_SEED = {"easy": (1_000_000,), "hard": (1_000_001,)}
SEEDS = {
    "segmentation": _ONE_SEED,
    "enhancement": _ONE_SEED,
    "synthesis": _ONE_SEED,
    # The five evaluation seeds per tier: a report task holds only a handful of nodules
    # and its fissures are its own, so fewer tasks are too noisy to judge a mean by.
    "report": {
        "easy": tuple(range(1_000_000, 1_000_010, 2)),
        "hard": tuple(range(1_000_001, 1_000_011, 2)),
    },
}
_FIVE_SEEDS = {
    "easy": tuple(range(1_000_000, 1_000_010, 2)),
    "hard": tuple(range(1_000_001, 1_000_011, 2)),
}
# The slow sweep: five seeds per tier, ten for report (twice its default run).
SWEEP = {
    "segmentation": _FIVE_SEEDS,
    "enhancement": _FIVE_SEEDS,
    "synthesis": _FIVE_SEEDS,
    "report": {
        "easy": tuple(range(1_000_000, 1_000_020, 2)),
        "hard": tuple(range(1_000_001, 1_000_021, 2)),
    },
}

OPEN: dict[tuple[str, str], str] = {}
"""(track, tier) cells where a heuristic is known to beat the bound, with the reason."""

BEATEN: dict[tuple[str, str], str] = {}
"""(track, tier) cells where a heuristic is known to beat the teacher itself."""


def _cells(tracks, open_cells: dict[tuple[str, str], str] | None = None):
    """One ``(track, tier)`` param per cell; the cells in ``open_cells`` marked xfail."""
    open_cells = open_cells or {}
    return [
        pytest.param(
            track,
            tier,
            id=f"{track}-{tier}",
            marks=(
                [pytest.mark.xfail(strict=False, reason=open_cells[track, tier])]
                if (track, tier) in open_cells
                else []
            ),
        )
        for track in tracks
        for tier in TIERS
    ]


def _assert_within(scores: dict[str, float], tier: str) -> None:
    limit = bound(scores)
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= limit, (tier, name, round(value, 3), round(limit, 3), scores)


@pytest.mark.parametrize(("track", "tier"), _cells(TRAIN_TRACKS))
def test_heuristics_stay_below_half_the_teachers_gain(bench, track, tier):
    assert_bound(bench, track, [s for s in range(8) if difficulty(s) == tier])


@pytest.mark.slow
@pytest.mark.parametrize(("track", "tier"), _cells(TRAIN_TRACKS))
def test_heuristics_stay_below_half_the_teachers_gain_over_many_tasks(bench, track, tier):
    assert_bound(bench, track, [s for s in range(8, 32) if difficulty(s) == tier])


@pytest.mark.parametrize("track", HELDOUT_TRACKS)
def test_the_track_has_heuristics(track):
    assert heuristics(track), "no model-free heuristic to hold to the bound"


@pytest.mark.parametrize(("track", "tier"), _cells(HELDOUT_TRACKS, BEATEN))
def test_the_teacher_beats_every_heuristic(bench, track, tier):
    scores = tier_scores(bench, track, SEEDS[track][tier])
    for name, value in scores.items():
        if name not in ("teacher", "naive"):
            assert value <= scores["teacher"] + 1e-9, (tier, name, scores)


@pytest.mark.parametrize(("track", "tier"), _cells(HELDOUT_TRACKS, OPEN))
def test_heuristics_score_at_most_half_the_teachers_margin_over_naive(bench, track, tier):
    _assert_within(tier_scores(bench, track, SEEDS[track][tier]), tier)


@pytest.mark.slow
@pytest.mark.parametrize(("track", "tier"), _cells(HELDOUT_TRACKS, OPEN))
def test_heuristics_stay_within_the_bound_over_the_sweep(bench, track, tier):
    _assert_within(tier_scores(bench, track, SWEEP[track][tier]), tier)
