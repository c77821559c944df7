"""The scoring protocol against hand-computed examples (REFERENCE.md, "Stages and scoring")."""

import pytest

from bat_gym.envs.toy_pipeline.suite import SPEC
from bat_gym.rubrics.verifier.scoring import (
    agentic_score,
    aggregate,
    e2e_reward,
    level_score,
    overall_score,
    stage_score,
    track_means,
)

EXACT = {"abs": 1e-12, "rel": 0}
# The reference agentic weights: S1 0.25, S2 0.15, S3 0.35, S4 0.15, S5 0.10.
assert [s.weight for s in SPEC.stages] == [0.25, 0.15, 0.35, 0.15, 0.10]


def test_stage_score_is_the_mean_of_binary_items_without_nulls():
    assert stage_score([True, True, False, True]) == 0.75
    assert stage_score([True, False, None, True]) == pytest.approx(2 / 3, **EXACT)
    assert stage_score([True, False], [3, 1]) == 0.75
    assert stage_score([None, None]) is None
    assert stage_score([]) is None
    assert stage_score([True, False], [0, 0]) is None
    with pytest.raises(ValueError, match="expected 2 weights"):
        stage_score([True, False], [1])


def test_level_score_is_the_highest_level_whose_items_all_pass():
    levels = [
        (0.0, []),
        (0.2, ["shape"]),
        (0.5, ["shape", "ran"]),
        (1.0, ["shape", "ran", "quality"]),
    ]
    assert level_score(levels, {"shape": False, "ran": True, "quality": True}) == 0.0
    assert level_score(levels, {"shape": True, "ran": False, "quality": True}) == 0.2
    assert level_score(levels, {"shape": True, "ran": True, "quality": False}) == 0.5
    assert level_score(levels, {"shape": True, "ran": True, "quality": True}) == 1.0
    # A null item is excluded: the level is reached on the items that could be scored.
    assert level_score(levels, {"shape": True, "ran": True, "quality": None}) == 1.0
    assert level_score(levels, {"shape": None, "ran": None, "quality": None}) is None
    assert level_score([(0.5, ["a"])], {"a": False}) == 0.0  # no level reached


def test_agentic_over_all_five_stages():
    scores = {"S1": 1.0, "S2": 0.0, "S3": 0.5, "S4": 1.0, "S5": 0.0}
    # 0.25*1 + 0.15*0 + 0.35*0.5 + 0.15*1 + 0.10*0 = 0.575 (weights sum to 1)
    assert agentic_score(scores, SPEC) == pytest.approx(0.575, **EXACT)


def test_agentic_renormalizes_over_a_non_applicable_stage_and_a_null_stage():
    # S5 is not applicable (absent) and S4 is null: both leave numerator and denominator.
    scores = {"S1": 1.0, "S2": 0.0, "S3": 0.5, "S4": None}
    # (0.25*1 + 0.15*0 + 0.35*0.5) / (0.25 + 0.15 + 0.35) = 0.425 / 0.75 = 17/30
    assert agentic_score(scores, SPEC) == pytest.approx(17 / 30, **EXACT)
    # A null stage is not a zero: scoring it 0 would give 0.425 / 0.9 instead.
    assert agentic_score({**scores, "S4": 0.0}, SPEC) == pytest.approx(0.425 / 0.9, **EXACT)
    assert agentic_score({"S4": None}, SPEC) is None
    assert agentic_score({}, SPEC) is None


def test_agentic_rejects_unknown_stages_and_out_of_range_scores():
    with pytest.raises(ValueError, match="not stages of toy_pipeline"):
        agentic_score({"S7": 1.0}, SPEC)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        agentic_score({"S1": 1.5}, SPEC)


def test_overall_uses_the_task_weight_of_the_spec():
    assert overall_score(0.8, 0.6, SPEC) == pytest.approx(0.5 * 0.8 + 0.5 * 0.6, **EXACT)
    heavier = SPEC.model_copy(update={"task_weight": 0.3})
    assert overall_score(0.8, 0.6, heavier) == pytest.approx(0.3 * 0.8 + 0.7 * 0.6, **EXACT)  # 0.66
    assert overall_score(None, 0.6, SPEC) is None
    assert overall_score(0.8, None, SPEC) is None
    # A part with weight 0 may be null.
    assert overall_score(None, 0.6, SPEC.model_copy(update={"task_weight": 0.0})) == 0.6
    assert overall_score(0.8, None, SPEC.model_copy(update={"task_weight": 1.0})) == 0.8


def test_e2e_reward_is_half_weighted_stage_mean_half_task():
    credits = {"S1": 1.0, "S2": 1.0, "S3": 0.5, "S4": 1.0, "S5": None}
    stage_mean = (0.25 + 0.15 + 0.35 * 0.5 + 0.15) / (0.25 + 0.15 + 0.35 + 0.15)  # 0.725/0.9
    assert e2e_reward(credits, 0.4, SPEC) == pytest.approx(0.5 * stage_mean + 0.5 * 0.4, **EXACT)
    assert e2e_reward(credits, None, SPEC) is None


def test_aggregate_is_mean_over_repeats_within_a_track_then_over_tracks():
    runs = {
        "threshold": [1.0, 0.0, None, 0.5],  # mean over scored repeats: 0.5
        "lookup": [1.0],  # 1.0
        "vqa": [None, None],  # unscored: left out
    }
    assert track_means(runs) == {"threshold": 0.5, "lookup": 1.0, "vqa": None}
    assert aggregate(runs) == pytest.approx((0.5 + 1.0) / 2, **EXACT)  # 0.75
    # Not the flat mean over runs, which would weigh the track with more repeats more.
    flat = [x for xs in runs.values() for x in xs if x is not None]
    assert sum(flat) / len(flat) == pytest.approx(0.625, **EXACT)
    assert aggregate({"vqa": [None]}) is None and aggregate({}) is None


def test_overall_from_tracks_end_to_end():
    # Two tracks x two repeats; each run has a task score and stage scores.
    runs = {
        "threshold": [
            (1.0, {"S1": 1.0, "S2": 1.0, "S3": 1.0, "S4": 1.0, "S5": 1.0}),
            (0.0, {"S1": 1.0, "S2": 0.0, "S3": 0.2, "S4": None, "S5": 0.0}),
        ],
        "lookup": [
            (0.5, {"S1": 0.0, "S2": 1.0, "S3": 0.5, "S4": 1.0, "S5": 1.0}),
            (None, {"S1": 1.0}),
        ],
    }
    overall = {
        t: [overall_score(task, agentic_score(st, SPEC), SPEC) for task, st in rs]
        for t, rs in runs.items()
    }
    # threshold run 2: agentic = (0.25*1 + 0.35*0.2) / (0.25+0.15+0.35+0.10) = 0.32/0.85
    # lookup run 1: agentic = 0.15 + 0.175 + 0.15 + 0.10 = 0.575
    expected = {
        "threshold": [1.0, 0.5 * 0.0 + 0.5 * (0.32 / 0.85)],
        "lookup": [0.5 * 0.5 + 0.5 * 0.575, None],  # the second run has no task score
    }
    for track in runs:
        for got, want in zip(overall[track], expected[track], strict=True):
            assert got == (None if want is None else pytest.approx(want, **EXACT))
    threshold_mean = (1.0 + 0.5 * 0.32 / 0.85) / 2
    lookup_mean = 0.25 + 0.2875
    assert aggregate(overall) == pytest.approx((threshold_mean + lookup_mean) / 2, **EXACT)
