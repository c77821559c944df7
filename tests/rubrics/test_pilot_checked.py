"""S3 pays for validation: a stated check of the pilot, recomputed, on a risky case."""

import hashlib
import json

import pytest

from bat_gym.benchmark import PilotFigure
from bat_gym.envs.skill_ladder.tasks import label_accuracy
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.model import ContractLibrary
from bat_gym.rubrics.verifier.verdict import verify

from .conftest import LABELS, START, call

LIB = ContractLibrary.reference()
PILOT = "id,label\ncase001,1\n"
# The task's check: case001's value in the model's unit. case002 is where a wrong
# pipeline would pass as well (the pitfall does not show there).
VALUES = {"case001": 0.42, "case002": 0.03, "case003": 0.99}
RISKY = frozenset({"case001", "case003"})
S3_START = {
    **START,
    "plan/plan.md": "# Plan\n",
    "setup/environment.json": "{}",
    "pipeline/infer.py": "x",
}
RUN = call(0, "python pipeline/infer.py validation/pilot.csv case001 && receipt")


def figure(ws, path, case):
    """The hand-made benchmark's check: ``value_cm`` within 1e-3, passing when the label is right."""
    if case not in VALUES:
        return PilotFigure("value_cm", None, False)
    return PilotFigure(
        "value_cm", VALUES[case], label_accuracy(ws, path, LABELS, scored=None) == 1.0, 1e-3
    )


def s3_files(pilot=PILOT, check=None):
    body = {
        "schema_version": 1,
        "stage": "S3",
        "artifact": "validation/pilot.csv",
        "sha256": hashlib.sha256(pilot.encode()).hexdigest(),
    }
    if check is not None:
        body["check"] = check
    return {"validation/pilot.csv": pilot, "validation/s3_validation.json": json.dumps(body)}


def checked(case="case001", name="value_cm", value=0.42, passed=True):
    return {"case": case, "name": name, "value": value, "passed": passed}


@pytest.fixture
def s3(make_ctx):
    """Score an S3 episode under the reference contract, with an oracle that declares a check."""

    def run(files, *, declares_check=True, risky=RISKY):
        ctx = make_ctx(files, start=S3_START, calls=[RUN])
        oracle = TaskOracle(
            lambda: {"labels": LABELS},
            lambda ws: None,
            lambda ws, path: label_accuracy(ws, path, LABELS, scored=None),
            risky_cases=lambda: risky,
            pilot_figure=figure if declares_check else None,
        )
        ctx = CheckContext(workspace=ctx.workspace, start=ctx.start, record=ctx.record, task=oracle)
        return verify(LIB.by_id("s3_validate"), ctx)

    return run


def items(verdict):
    return {i.id: i for i in verdict.stages[0].items}


def test_a_checked_pilot_on_a_risky_case_earns_the_top_level(s3):
    v = s3(s3_files(check=checked()))
    assert v.reward == 1.0
    assert items(v)["pilot_check_risky"].passed is True


def test_an_unchecked_pilot_earns_less_than_the_top_level(s3):
    # The pilot is right and really ran, its receipt is true: only the check is missing.
    v = s3(s3_files())
    assert items(v)["pilot_quality"].passed is True
    assert items(v)["pilot_check_confirmed"].passed is False
    assert "states no check" in items(v)["pilot_check_confirmed"].detail
    assert v.reward == 0.0


@pytest.mark.parametrize(
    "check",
    [
        checked(value=0.99),  # a value the check does not compute on this case
        checked(value="0.42"),  # a number stated as text
        checked(name="pilot_ok"),  # another figure than the task's
        checked(case="case003", value=0.99),  # a case the pilot does not hold
        {"case": "case001", "value": 0.42, "passed": True},  # no name
    ],
)
def test_a_receipt_whose_stated_figure_is_false_earns_nothing_at_that_level(s3, check):
    v = s3(s3_files(check=check))
    assert items(v)["pilot_check_confirmed"].passed is False
    assert v.reward < 0.5


def test_a_check_stated_as_passed_that_its_figure_does_not_bear_out_fails(s3):
    wrong = "id,label\ncase001,0\n"
    v = s3(s3_files(wrong, check=checked(passed=True)))
    assert items(v)["pilot_check_confirmed"].passed is False
    assert "does not bear out" in items(v)["pilot_check_confirmed"].detail
    # Stated honestly as failed, the check is confirmed, but it is no validated pilot.
    v = s3(s3_files(wrong, check=checked(passed=False)))
    assert items(v)["pilot_check_confirmed"].passed is True
    assert items(v)["pilot_check_risky"].passed is False and v.reward == 0.2


def test_a_check_on_a_case_where_the_pitfall_does_not_show_does_not_count(s3):
    pilot = "id,label\ncase002,0\n"
    v = s3(s3_files(pilot, check=checked(case="case002", value=0.03)))
    assert items(v)["pilot_check_confirmed"].passed is True
    assert items(v)["pilot_check_risky"].passed is False
    assert "pitfall" in items(v)["pilot_check_risky"].detail
    assert v.reward == 0.2


def test_without_a_declared_risk_every_case_counts(s3):
    pilot = "id,label\ncase002,0\n"
    v = s3(s3_files(pilot, check=checked(case="case002", value=0.03)), risky=None)
    assert v.reward == 1.0


def test_a_benchmark_that_declares_no_check_keeps_the_levels_it_had(s3):
    # The check items are null and left out: the pilot's shape, run, receipt and quality decide.
    v = s3(s3_files(), declares_check=False)
    assert items(v)["pilot_check_confirmed"].passed is None
    assert v.reward == 1.0


def test_the_detail_never_gives_the_recomputed_figure(make_ctx):
    ctx = make_ctx(s3_files(check=checked(value=0.5)), start=S3_START, calls=[RUN])
    oracle = TaskOracle(lambda: {}, lambda ws: None, pilot_figure=figure)
    ctx = CheckContext(workspace=ctx.workspace, start=ctx.start, record=ctx.record, task=oracle)
    result = run_check(
        "pilot_checked",
        ctx,
        {"path": "validation/pilot.csv", "receipt": "validation/s3_validation.json"},
    )
    assert result.passed is False and "0.42" not in result.detail and "0.5" in result.detail
