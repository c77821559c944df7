"""Plan facts are credited right and once; numbers agree within the benchmark's tolerance.

Hand-made plans against hand-declared facts (``plan_states_facts``), and hand-made CSVs
against a reference run (``matches_reference``) under a per-column tolerance.
"""

from __future__ import annotations

import pytest

from bat_gym.benchmark import PlanFact, Tolerance
from bat_gym.core.record import ExecutionRecord
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

from .conftest import START

PLAN = "plan/plan.md"
UNITS = ("mm", "cm", "m")
FACTS = (
    PlanFact.count("the number of cases", 12),
    PlanFact.choice("the unit the values are given in", "mm", UNITS, kind="unit"),
    PlanFact.choice("the model's unit", "cm", UNITS, kind="unit"),
    PlanFact.setting("the flag the task needs", "--codes", "lower"),
)
CONCISE = (
    "# Plan\n\n## Preprocess\nRead data/cases.csv (12 cases); convert the values from mm to "
    "cm, the model's unit.\n\n## Inference\nRun pipeline/infer.py with --codes lower.\n\n"
    "## Postprocess\nWrite outputs/submission.csv with a receipt.\n"
)


def plan_check(store, plan: str, facts=FACTS, **args):
    ws = FrozenWorkspace.from_files(store, {**START, PLAN: plan})
    oracle = TaskOracle(lambda: {}, lambda ws: None, plan_facts=lambda: facts)
    ctx = CheckContext(
        workspace=ws,
        start=FrozenWorkspace.from_files(store, START),
        record=ExecutionRecord(start_digest="0" * 64),
        task=oracle,
    )
    return run_check("plan_states_facts", ctx, {"path": PLAN, **args})


def test_a_plan_stating_each_value_right_earns_the_facts(store):
    assert plan_check(store, CONCISE).passed is True
    # The values alone state every fact: what a teacher's plan must contain.
    assert plan_check(store, " ".join(f.value for f in FACTS)).passed is True


@pytest.mark.parametrize(
    ("plan", "fact"),
    [
        (CONCISE.replace("(12 cases)", "(12 cases, of which 3 cases are hard)"), "cases"),
        (CONCISE.replace("from mm to", "from mm (or m) to"), "unit the values"),
        (CONCISE + "\nIf that fails, try --codes legacy.\n", "the flag"),
    ],
)
def test_a_right_value_next_to_a_rival_earns_nothing(store, plan, fact):
    result = plan_check(store, plan)
    assert result.passed is False
    assert "contradicts itself" in result.detail and fact in result.detail
    # The detail names the fact, never its value or pattern.
    assert "12 cases" not in result.detail and "legacy" not in result.detail


def test_two_facts_of_one_kind_state_each_others_values(store):
    # mm and cm are both units of this task: neither contradicts the other.
    only_input = (PlanFact.choice("the unit", "mm", UNITS, kind="unit"),)
    assert plan_check(store, "from mm", only_input).passed is True
    assert plan_check(store, "from mm to cm", only_input).passed is False


def test_a_blind_enumeration_earns_nothing(store):
    counts = ", ".join(f"{n} cases" for n in range(1, 121))
    dump = (
        f"# Plan\n\n## Preprocess\n{counts}. Units: mm cm m inch. --codes lower --codes legacy "
        "--codes upper.\n\n## Inference\nAs above.\n\n## Postprocess\nAs above.\n"
    )
    result = plan_check(store, dump, max_words=10_000)
    assert result.passed is False
    for fact in FACTS:
        assert fact.name in result.detail


def test_a_long_plan_earns_no_more_than_a_concise_one(store):
    padded = CONCISE + "\nNotes: " + "the pipeline is careful. " * 120
    assert plan_check(store, CONCISE, max_words=400).passed is True
    result = plan_check(store, padded, max_words=400)
    assert result.passed is False and "more than the 400" in result.detail


def test_a_missing_fact_is_named(store):
    result = plan_check(store, CONCISE.replace(" with --codes lower", ""))
    assert result.passed is False and "does not state the flag the task needs" in result.detail


def test_counts_and_settings_are_read_as_whole_values(store):
    count = (PlanFact.count("the number of cases", 12),)
    assert plan_check(store, "112 cases", count).passed is False  # another count
    assert plan_check(store, "version 3.12 cases", count).passed is False  # not a count
    assert plan_check(store, "12 cases; validate on 1 case", count).passed is True
    flag = (PlanFact.setting("the flag", "--unit", "mm"),)
    assert plan_check(store, "It needs --unit mm.", flag).passed is True
    assert plan_check(store, "It needs --unit mmx.", flag).passed is False
    unit = (PlanFact.choice("the unit", "mm", UNITS, kind="unit"),)
    assert plan_check(store, "in mm. I'm sure.", unit).passed is True  # "I'm" is no metre


# -- numeric agreement: the benchmark's tolerance, never widened -----------------------

REFERENCE = "id,score,volume_ml\ncase001,0.8731,12.5\ncase002,0.1204,3.25\n"


def agree(store, mine: str, tolerance=None):
    ref = FrozenWorkspace.from_files(store, {**START, "outputs/submission.csv": REFERENCE})
    ws = FrozenWorkspace.from_files(store, {**START, "outputs/submission.csv": mine})
    oracle = TaskOracle(
        lambda: {},
        lambda ws: None,
        reference=lambda: ref,
        tolerance=None if tolerance is None else (lambda: tolerance),
    )
    ctx = CheckContext(
        workspace=ws,
        start=FrozenWorkspace.from_files(store, START),
        record=ExecutionRecord(start_digest="0" * 64),
        task=oracle,
    )
    args = {"path": "outputs/submission.csv", "mode": "rows", "complete": True}
    return run_check("matches_reference", ctx, args)


def test_one_decimal_printing_fails_where_the_tolerance_is_finer(store):
    coarse = "id,score,volume_ml\ncase001,0.9,12.5\ncase002,0.1,3.2\n"
    result = agree(store, coarse, {"score": Tolerance(atol=1e-4)})
    assert result.passed is False
    assert "coarser than its tolerance" in result.detail and "score" in result.detail
    # Without a declared tolerance the check's own (exact up to float printing) holds.
    assert agree(store, coarse).passed is False


def test_numbers_agree_within_their_columns_declared_tolerance(store):
    close = "id,score,volume_ml\ncase001,0.87314,12.5\ncase002,0.12035,3.25\n"
    tolerance = {"score": Tolerance(atol=1e-4)}
    assert agree(store, close, tolerance).passed is True
    # The score's tolerance is not the volume's: 3.25 printed as 3.2 fails.
    result = agree(store, close.replace("3.25", "3.2"), tolerance)
    assert result.passed is False and "volume_ml" in result.detail
    # "*" covers every column the benchmark does not name.
    wide = {"score": Tolerance(atol=1e-4), "*": Tolerance(atol=0.1)}
    assert agree(store, close.replace("3.25", "3.2"), wide).passed is True


def test_the_same_value_printed_to_more_decimals_agrees(store):
    finer = "id,score,volume_ml\ncase001,0.873100000001,12.50\ncase002,0.1204,3.250\n"
    assert agree(store, finer).passed is True
