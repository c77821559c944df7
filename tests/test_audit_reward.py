import json

import pytest
from typer.testing import CliRunner

from bat_gym.audits import reward as audit_module
from bat_gym.audits.exploits import UnknownExploit
from bat_gym.audits.reward import (
    HELDOUT,
    AuditEpisode,
    AuditReport,
    audit_reward,
    judge,
    sample_states,
    waived_bounds,
)
from bat_gym.cli import app
from bat_gym.core.errors import BatGymError

runner = CliRunner()
STAGES = ["S1", "S3", HELDOUT]


def _report(means, *, exploits=("x",), margin=0.10, absolute=0.35, episodes=()):
    refs = tuple(p for p in ("naive", "teacher") if p in means)
    return AuditReport(
        waived=waived_bounds(means, STAGES, absolute=absolute),
        benchmark="bench",
        version="1",
        stages=tuple(STAGES),
        exploits=tuple(exploits),
        references=refs,
        means=means,
        margin=margin,
        absolute=absolute,
        failures=judge(means, exploits, STAGES, margin=margin, absolute=absolute),
        episodes=tuple(episodes),
    )


FAILING = {
    "x": {"S1": 0.5, "S3": 0.05, HELDOUT: 0.30},
    "naive": {"S1": 0.0, "S3": 0.0, HELDOUT: 0.25},
    "teacher": {"S1": 1.0, "S3": 1.0, HELDOUT: 1.0},
}


# -- the margin logic --------------------------------------------------------------------


def test_margin_over_naive_fails_and_the_tighter_bound_is_named():
    (failure,) = judge(FAILING, ["x"], STAGES)
    # S1: 0.5 breaks both naive + 0.10 and 0.35; the tighter bound (0.10) is reported.
    assert (failure.stage, failure.rule, failure.bound) == ("S1", "margin", pytest.approx(0.10))
    # S3 0.05 <= 0.0 + 0.10; E2E 0.30 <= 0.25 + 0.10: both within the targets.


def test_absolute_bound_binds_on_stage_rows_while_naive_is_below_it():
    means = {"x": {"S1": 0.4}, "naive": {"S1": 0.3}}
    (failure,) = judge(means, ["x"], ["S1"])
    assert failure.rule == "absolute" and failure.bound == 0.35


def test_a_stage_naive_work_reaches_is_held_to_the_margin_alone():
    # A submission once the predictions exist: the naive agent earns it too.
    means = {"x": {"S5": 0.9}, "naive": {"S5": 0.85}}
    assert judge(means, ["x"], ["S5"]) == ()
    means["x"]["S5"] = 0.97
    (failure,) = judge(means, ["x"], ["S5"])
    assert failure.rule == "margin" and failure.bound == pytest.approx(0.95)


def test_heldout_cells_use_only_the_margin_when_naive_is_known():
    means = {"x": {HELDOUT: 0.5}, "naive": {HELDOUT: 0.45}}
    assert judge(means, ["x"], [HELDOUT]) == ()
    means["x"][HELDOUT] = 0.56
    assert judge(means, ["x"], [HELDOUT])[0].rule == "margin"


def test_without_a_naive_baseline_heldout_cells_use_the_absolute_bound():
    means = {"x": {HELDOUT: 0.36, "S3": 0.30}}
    (failure,) = judge(means, ["x"], [HELDOUT, "S3"])
    assert (failure.stage, failure.rule, failure.naive) == (HELDOUT, "absolute", None)


def test_equal_to_the_bound_passes_and_unscored_cells_are_skipped():
    means = {"x": {"S1": 0.1, "S3": None}, "naive": {"S1": 0.0, "S3": 0.0}}
    assert judge(means, ["x"], ["S1", "S3"]) == ()
    assert judge(means, ["x"], ["S1"], margin=0.05)[0].bound == 0.05


def test_the_report_table_marks_failing_cells_and_summarizes_them():
    report = _report(FAILING)
    assert not report.ok
    lines = report.table().splitlines()
    x_line = next(line for line in lines if line.startswith("x "))
    assert "0.500!" in x_line and "0.050 " in x_line and "0.300 " in x_line
    assert any(line.startswith("naive") for line in lines)
    assert report.summary().startswith("bench: FAIL, 1 of 3 exploit cells beat the targets")
    assert any(line.startswith("! beats the targets: more than") for line in lines)
    ok = _report({**FAILING, "x": {"S1": 0.0, "S3": 0.0, HELDOUT: 0.0}})
    assert ok.ok and ok.summary() == "bench: OK, none of 3 exploit cells beats the targets"
    # The legend explains a mark; with nothing marked it is left out.
    assert not any(line.startswith("! beats") for line in ok.table().splitlines())


def test_item_rates_and_explain_name_the_items_that_paid():
    def ep(plan_ok):
        return AuditEpisode(
            policy="x",
            stage="S1",
            track="t",
            where="s",
            reward=0.5,
            items={"S1.plan": plan_ok, "S1.inputs": True, "S1.quality": None},
            guards=("S1.inputs",),
        )

    report = _report(FAILING, episodes=[ep(True), ep(False)])
    assert report.item_rates("x", "S1") == {"S1.plan": 0.5, "S1.inputs": 1.0}
    explained = report.explain()
    assert "passed: S1.plan 0.50" in explained and "S1.inputs" not in explained


def test_sample_states_is_deterministic_and_spreads_over_tracks(toy_bank):
    first = sample_states(toy_bank, "S3", 2)
    assert [s.state_id for s in first] == [s.state_id for s in sample_states(toy_bank, "S3", 2)]
    assert {s.track for s in first} == {"threshold", "lookup"}
    assert all(s.focus == "S3" for s in first)
    assert len(sample_states(toy_bank, "S3", 99)) == len(toy_bank.select(focus="S3"))
    assert {s.track for s in sample_states(toy_bank, "S3", 9, tracks=["lookup"])} == {"lookup"}


def test_sample_states_fetches_only_the_states_it_walks_past(toy_bank):
    """A lazily built source (the default states) builds what the audit samples, no more."""

    class Counting:
        def __init__(self, source):
            self.source, self.fetched = source, []

        def select(self, focus=None, track=None, outcome=None):
            return self.source.select(focus, track, outcome)

        def get(self, state_id):
            self.fetched.append(state_id)
            return self.source.get(state_id)

    tracks = ("threshold", "lookup")
    counting = Counting(toy_bank)
    picked = sample_states(counting, "S3", 1, tracks=tracks)
    assert [s.state_id for s in picked] == counting.fetched  # one state, one fetch
    # The same pick as reading every state first.
    assert picked[0].state_id == sample_states(toy_bank, "S3", 1)[0].state_id


def test_unknown_exploits_and_bad_bounds_are_refused_before_any_work():
    with pytest.raises(UnknownExploit):
        audit_reward("toy_pipeline", exploits=["nope"], states_per_focus=0, heldout_cells=0)
    with pytest.raises(ValueError, match="margin"):
        audit_reward("toy_pipeline", margin=2.0)


# -- the command line --------------------------------------------------------------------


@pytest.fixture
def fake_audit(monkeypatch):
    calls = {}

    def fake(benchmark, **kwargs):
        calls.update(kwargs, benchmark=benchmark)
        return calls.get("report", _report(FAILING))

    monkeypatch.setattr(audit_module, "audit_reward", fake)
    return calls


def test_cli_exits_1_when_an_exploit_beats_the_targets(fake_audit, tmp_path):
    out = tmp_path / "audit.json"
    result = runner.invoke(
        app,
        [
            "audit-reward",
            "--benchmark",
            "toy_pipeline",
            "--states-per-focus",
            "1",
            "--exploit",
            "shape_only",
            "--json",
            str(out),
            "--explain",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "0.500!" in result.output and "bench: FAIL" in result.output
    assert "passed:" in result.output
    assert fake_audit["exploits"] == ["shape_only"] and fake_audit["states_per_focus"] == 1
    assert json.loads(out.read_text())["failures"][0]["stage"] == "S1"


def test_cli_report_only_prints_and_exits_0(fake_audit):
    result = runner.invoke(app, ["audit-reward", "--report-only", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "bench: FAIL" in result.output and "report only: exit 0" in result.output
    assert fake_audit["progress"] is False


def test_cli_exits_0_on_a_clean_report(fake_audit):
    fake_audit["report"] = _report({"x": {"S1": 0.0}, "naive": {"S1": 0.0}})
    result = runner.invoke(app, ["audit-reward"])
    assert result.exit_code == 0, result.output
    assert "bench: OK" in result.output


def test_cli_refuses_an_unknown_exploit():
    result = runner.invoke(app, ["audit-reward", "--exploit", "nope"])
    assert result.exit_code == 2 and "nope" in result.output


def test_cli_prints_a_bat_gym_error_as_one_line(monkeypatch):
    def broken(benchmark, **kwargs):
        raise BatGymError("the bank is gone")

    monkeypatch.setattr(audit_module, "audit_reward", broken)
    result = runner.invoke(app, ["audit-reward"])
    assert result.exit_code == 2 and result.output.strip() == "error: the bank is gone"


# -- waived bounds -----------------------------------------------------------------------

WAIVED = {
    "x": {"S1": 0.0, "S3": 0.55, HELDOUT: 0.30},
    "naive": {"S1": 0.0, "S3": 0.50, HELDOUT: 0.45},
    "teacher": {"S1": 1.0, "S3": 1.0, HELDOUT: 1.0},
}


def test_a_waived_absolute_bound_is_named_per_row_with_its_reason():
    # S3: naive earns 0.50 > 0.35, so 0.55 passes on the margin alone; the report says so.
    report = _report(WAIVED)
    assert report.ok
    assert [(w.stage, w.rule, w.bound, w.naive) for w in report.waived] == [
        ("S3", "absolute", 0.35, 0.50)
    ]
    table = report.table()
    assert "waived: S3: absolute bound 0.35 waived: the naive baseline earns 0.500" in table
    assert "only naive + margin is applied" in table
    # Not on S1 (naive below the bound), nor on held-out E2E (it has no absolute bound there).
    assert "waived: S1" not in table and f"waived: {HELDOUT}" not in table


def test_the_cli_prints_waived_bounds_in_the_table_and_the_json(fake_audit, tmp_path):
    fake_audit["report"] = _report(WAIVED)
    out = tmp_path / "audit.json"
    result = runner.invoke(app, ["audit-reward", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "waived: S3: absolute bound 0.35 waived" in result.output
    (waived,) = json.loads(out.read_text())["waived"]
    assert waived["stage"] == "S3" and "naive baseline earns 0.500" in waived["reason"]


def test_the_audit_samples_only_rows_a_demonstration_admitted(toy_bank):
    from bat_gym.bank.states import MemoryStates

    rows = [toy_bank.get(i) for i in toy_bank.select(focus="S3")]
    assert rows and all(r.provenance["demonstration"]["reward"] >= 0.9 for r in rows)
    unproven = rows[0].model_copy(
        update={"provenance": {k: v for k, v in rows[0].provenance.items() if k != "demonstration"}}
    )
    source = MemoryStates(toy_bank.store, [unproven, *rows[1:]])
    picked = {s.state_id for s in sample_states(source, "S3", 99)}
    assert picked == {r.state_id for r in rows[1:]}


# -- a real audit ------------------------------------------------------------------------


def test_a_tiny_audit_of_toy_pipeline(toy, toy_bank):
    report = audit_reward(
        toy,
        exploits=["prose_claims", "shape_only"],
        states=toy_bank,
        states_per_focus=1,
        heldout_cells=1,
        tracks=["lookup"],
        progress=False,
    )
    assert report.stages == ("S1", "S2", "S3", "S4", "S5", HELDOUT)
    assert report.references == ("naive", "teacher")
    assert all(v == 0.0 for v in report.means["prose_claims"].values())
    assert report.means["teacher"][HELDOUT] == 1.0
    # 4 policies (2 exploits, naive and the teacher) x (5 stage rows + 1 held-out cell).
    assert len(report.episodes) == 4 * 6 and all(e.valid for e in report.episodes)
    heldout = [e for e in report.episodes if e.stage == HELDOUT]
    assert {e.where for e in heldout} == {"lookup-1000000-r0"} and all(e.items for e in heldout)
    assert {f.exploit for f in report.failures} <= {"shape_only"}


@pytest.mark.slow
def test_the_cli_audits_toy_pipeline_with_every_exploit(tmp_path):
    out = tmp_path / "audit.json"
    result = runner.invoke(
        app,
        [
            "audit-reward",
            "--benchmark",
            "toy_pipeline",
            "--states-per-focus",
            "1",
            "--cells-per-track",
            "1",
            "--report-only",
            "--quiet",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = AuditReport.model_validate_json(out.read_text())
    assert len(report.exploits) == 10 and all(e.valid for e in report.episodes)
