import json

import pytest

from bat_gym.curriculum.gate import GateDecision, gate
from bat_gym.curriculum.selection import (
    DeficitSelector,
    NoTargetStage,
    PaperSelector,
    ProgressSelector,
    TargetSelector,
    make_selector,
    paper_target,
)
from bat_gym.evaluation.aggregates import Aggregates, CompletionCounts

IDS = ("S1", "S2", "S3", "S4", "S5")
WEIGHTS = {"S1": 0.25, "S2": 0.15, "S3": 0.35, "S4": 0.15, "S5": 0.10}


def run(stages, overall: float = 0.6) -> Aggregates:
    if not isinstance(stages, dict):
        stages = dict(zip(IDS, stages, strict=True))
    n = CompletionCounts(runs=10, valid=10, invalid=0, finished=10, scored=10)
    return Aggregates(
        overall=overall,
        task=0.5,
        agentic=0.5,
        stages=stages,
        tracks={},
        completion=n,
        failures={},
        cells_digest="d" * 64,
    )


def decide(baseline, candidate) -> GateDecision:
    return gate(run(baseline), run(candidate))


# -- the paper's worked examples (docs/scoring-and-selection.md of the authors' release) --


def test_worked_example_pass_selects_the_lowest_stage():
    d = decide([0.70, 0.55, 0.20, 0.45, 0.60], [0.70, 0.55, 0.20, 0.45, 0.60])
    assert d.decision == "promote"
    assert PaperSelector().select(d) == "S3"


def test_worked_example_tie_goes_to_the_earlier_stage():
    d = decide([0.40, 0.40, 0.65, 0.70, 0.75], [0.40, 0.40, 0.65, 0.70, 0.75])
    assert d.decision == "promote"
    assert PaperSelector().select(d) == "S1"


def test_worked_example_hold_selects_the_largest_regression():
    # S4 fell 0.12 and S3 fell 0.04; the lowest candidate stage (S1) loses to S4.
    d = decide([0.30, 0.50, 0.60, 0.70, 0.80], [0.30, 0.50, 0.56, 0.58, 0.80])
    assert d.decision == "hold"
    assert d.regressions["S4"] == pytest.approx(0.12)
    assert d.regressions["S3"] == pytest.approx(0.04)
    assert PaperSelector().select(d) == "S4"


# -- the rule's edges --------------------------------------------------------------------


def test_a_promotion_ignores_regressions():
    # S2 regressed, but the gate passed (S2 is not guarded): lowest stage wins.
    d = decide([0.7, 0.9, 0.5, 0.5, 0.5], [0.7, 0.6, 0.5, 0.5, 0.45 + 0.03])
    assert d.decision == "promote"
    assert PaperSelector().select(d) == "S5"


def test_a_hold_without_positive_regression_selects_the_lowest_stage():
    # Held on overall alone; every stage improved.
    d = gate(run([0.5] * 5, overall=0.6), run([0.6, 0.7, 0.55, 0.8, 0.9], overall=0.5))
    assert d.decision == "hold"
    assert PaperSelector().select(d) == "S3"


def test_a_catastrophic_decision_counts_as_a_hold():
    d = gate(run([0.5] * 5, overall=0.6), run([0.2, 0.5, 0.5, 0.45, 0.5], overall=0.3))
    assert d.decision == "catastrophic"
    assert PaperSelector().select(d) == "S1"


def test_regression_ties_go_to_the_earlier_stage():
    regressions = {"S2": 0.05, "S4": 0.05, "S5": 0.01}
    candidate = {"S1": 0.1, "S2": 0.5, "S3": 0.5, "S4": 0.5, "S5": 0.5}
    assert paper_target(candidate, regressions=regressions, held=True) == "S2"


def test_float_noise_is_a_tie():
    assert paper_target({"S1": 0.3, "S2": 0.1 + 0.2}) == "S1"
    assert paper_target({"S1": 0.1 + 0.2, "S2": 0.3}) == "S1"


def test_stages_order_numerically():
    assert paper_target({"S10": 0.2, "S9": 0.2}) == "S9"


def test_null_stages_are_never_selected():
    assert paper_target({"S1": None, "S2": 0.9, "S3": None}) == "S2"
    # A regression on a stage the candidate no longer scores cannot be trained towards.
    assert paper_target({"S1": 0.5, "S2": None}, regressions={"S2": 0.3}, held=True) == "S1"


def test_no_scored_stage_raises():
    with pytest.raises(NoTargetStage, match="no stage has a score"):
        paper_target({"S1": None, "S2": None})
    with pytest.raises(NoTargetStage):
        PaperSelector().select(decide([None] * 5, [None] * 5))


# -- the weight-aware deficit selector ---------------------------------------------------


def test_deficit_weights_the_shortfall(toy):
    d = decide([0.9, 0.9, 0.6, 0.9, 0.3], [0.9, 0.9, 0.6, 0.9, 0.3])
    # Paper: S5 is lowest. Deficit: S3 0.35 * 0.4 = 0.14 beats S5 0.10 * 0.7 = 0.07.
    assert PaperSelector().select(d) == "S5"
    assert DeficitSelector.from_spec(toy.spec).select(d) == "S3"
    assert DeficitSelector.from_spec(toy.spec).weights == WEIGHTS
    # The same rule on bare scores (no gate decision), as a benchmark script uses it.
    assert DeficitSelector(WEIGHTS).target({"S1": 0.9, "S3": 0.6, "S5": 0.3}) == "S3"


def test_deficit_ties_go_to_the_earlier_stage():
    # S2: 0.15 * 0.6 = 0.09; S4: 0.15 * 0.6 = 0.09.
    d = decide([0.9, 0.4, 0.9, 0.4, 0.9], [0.9, 0.4, 0.9, 0.4, 0.9])
    assert DeficitSelector(WEIGHTS).select(d) == "S2"


def test_deficit_reads_the_checkpoint_the_next_round_starts_from():
    # Held: the candidate is discarded, so the baseline's scores decide.
    d = gate(run([0.9, 0.9, 0.2, 0.9, 0.9]), run([0.9, 0.0, 0.9, 0.9, 0.9], overall=0.4))
    assert d.decision != "promote"
    assert DeficitSelector(WEIGHTS).select(d) == "S3"


def test_deficit_skips_null_and_unweighted_stages():
    d = decide([0.0, None, 0.5, 0.5, 0.5], [0.0, None, 0.5, 0.5, 0.5])
    assert DeficitSelector({"S2": 1.0, "S3": 0.5, "S4": 0.1}).select(d) == "S3"
    with pytest.raises(NoTargetStage):
        DeficitSelector({"S2": 1.0}).select(d)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        DeficitSelector({"S1": 1.5})


# -- the learning-progress bandit --------------------------------------------------------

# Per stage: how much a round that targeted it moved it (a regression of -0.08 on S3 is
# an improvement of 0.08: absolute progress 0.08).
REGRESSIONS = {"S1": 0.01, "S2": 0.02, "S3": -0.08, "S4": 0.03, "S5": 0.0}
BASE = [0.5] * 5
CAND = [0.5 - REGRESSIONS[s] for s in IDS]
STEADY = decide(BASE, CAND)


def play(selector: TargetSelector, rounds: int, decision: GateDecision = STEADY) -> list[str]:
    return [selector.select(decision) for _ in range(rounds)]


def test_progress_tries_each_stage_then_follows_the_largest_progress():
    picks = play(ProgressSelector(epsilon=0.0, exploration=0.0), 8)
    assert picks == ["S1", "S2", "S3", "S4", "S5", "S3", "S3", "S3"]


def test_progress_estimates_are_moving_averages():
    sel = ProgressSelector(epsilon=0.0, exploration=0.0, smoothing=0.5)
    play(sel, 7)  # judged: S1..S5, then S3 once more
    assert sel.pulls == {"S1": 1, "S2": 1, "S3": 2, "S4": 1, "S5": 1}
    assert sel.progress["S3"] == pytest.approx(0.08)
    assert sel.progress["S4"] == pytest.approx(0.03)
    quieter = decide(BASE, [0.5, 0.5, 0.5, 0.5, 0.5])
    sel.select(quieter)  # judges the S3 round: |delta| = 0, so LP = 0.5 * 0.08
    assert sel.progress["S3"] == pytest.approx(0.04)


def test_progress_exploration_bonus_revisits_stages():
    picks = play(ProgressSelector(epsilon=0.0, exploration=1.0), 7)
    # After S1..S5 and S3, a once-tried stage's bonus sqrt(ln 6 / 1) outweighs S3's lead
    # in progress; among those, S4 has made the most progress.
    assert picks[5] == "S3" and picks[6] == "S4"


def test_progress_null_delta_counts_as_tried_without_progress():
    sel = ProgressSelector(epsilon=0.0, exploration=0.0)
    d = decide([None, 0.5, 0.5, 0.5, 0.5], [0.5] * 5)
    assert play(sel, 2, d) == ["S1", "S2"]
    assert sel.pulls == {"S1": 1} and sel.progress == {}


def test_progress_is_deterministic_given_a_seed():
    a = play(ProgressSelector(seed=7, epsilon=0.5), 30)
    b = play(ProgressSelector(seed=7, epsilon=0.5), 30)
    c = play(ProgressSelector(seed=8, epsilon=0.5), 30)
    assert a == b and a != c


def test_progress_resumes_from_its_state_dict():
    whole = play(ProgressSelector(seed=3, epsilon=0.3, exploration=0.05), 16)
    first = ProgressSelector(seed=3, epsilon=0.3, exploration=0.05)
    head = play(first, 9)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = ProgressSelector()  # configuration comes from the state
    resumed.load_state_dict(state)
    assert head + play(resumed, 7) == whole


def test_progress_validates_its_arguments():
    for kwargs in ({"epsilon": 1.5}, {"exploration": -1.0}, {"smoothing": 0.0}):
        with pytest.raises(ValueError):
            ProgressSelector(**kwargs)


def test_a_failed_selection_leaves_the_state_alone():
    sel = ProgressSelector(epsilon=0.0)
    sel.select(STEADY)
    before = sel.state_dict()
    with pytest.raises(NoTargetStage):
        sel.select(decide([None] * 5, [None] * 5))
    assert sel.state_dict() == before


# -- the shared interface ----------------------------------------------------------------


def test_stateless_selectors_round_trip_their_state():
    for sel in (PaperSelector(), DeficitSelector(WEIGHTS)):
        sel.load_state_dict(json.loads(json.dumps(sel.state_dict())))


def test_state_of_another_selector_is_refused():
    with pytest.raises(ValueError, match="'paper' selector"):
        PaperSelector().load_state_dict(ProgressSelector().state_dict())
    with pytest.raises(ValueError, match="version"):
        ProgressSelector().load_state_dict({**ProgressSelector().state_dict(), "version": 99})


def test_make_selector(toy):
    assert isinstance(make_selector(), PaperSelector)
    assert isinstance(make_selector("deficit", spec=toy.spec), DeficitSelector)
    progress = make_selector("progress", seed=5)
    assert isinstance(progress, ProgressSelector) and progress.seed == 5
    with pytest.raises(ValueError, match="pass spec="):
        make_selector("deficit")
    with pytest.raises(ValueError, match="unknown selector"):
        make_selector("greedy")
