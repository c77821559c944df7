import json

import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.core.errors import BatGymError
from bat_gym.curriculum.gate import GateDecision, GateRefused, GateThresholds, gate
from bat_gym.evaluation.aggregates import Aggregates, CompletionCounts, TrackAggregate

DIGEST = "a" * 64
STAGES = {"S1": 0.7, "S2": 0.6, "S3": 0.5, "S4": 0.5, "S5": 0.5}
runner = CliRunner()


def counts(runs: int = 20, invalid: int = 0) -> CompletionCounts:
    valid = runs - invalid
    return CompletionCounts(runs=runs, valid=valid, invalid=invalid, finished=valid, scored=valid)


def run(
    overall: float | None = 0.60,
    task: float | None = 0.50,
    stages: dict[str, float | None] | None = None,
    tracks: dict[str, float | None] | None = None,
    invalid: int = 0,
    digest: str = DIGEST,
) -> Aggregates:
    tracks = {"detection": 0.60, "segmentation": 0.60} if tracks is None else tracks
    return Aggregates(
        overall=overall,
        task=task,
        agentic=0.5,
        stages=dict(STAGES if stages is None else stages),
        tracks={
            name: TrackAggregate(overall=o, task=o, stages={}, completion=counts(10))
            for name, o in tracks.items()
        },
        completion=counts(invalid=invalid),
        failures={},
        cells_digest=digest,
    )


def check(decision: GateDecision, name: str):
    (found,) = [c for c in decision.checks if c.name == name]
    return found


def test_defaults_are_the_reference_values():
    t = GateThresholds()
    assert (t.max_overall_drop, t.max_task_drop, t.max_track_drop, t.max_stage_drop) == (
        0.01,
        0.03,
        0.05,
        0.03,
    )
    assert t.guarded_stages == ("S3", "S4", "S5") and t.catastrophic_drop == 0.20


def test_identical_runs_promote_with_every_check_listed():
    d = gate(run(), run())
    assert d.decision == "promote" and d.promoted and d.failed == ()
    assert [c.name for c in d.checks] == [
        "overall",
        "task",
        "track:detection",
        "track:segmentation",
        "stage:S3",
        "stage:S4",
        "stage:S5",
        "catastrophic",
    ]
    assert all(c.drop == 0.0 for c in d.checks)
    assert d.regressions == {s: 0.0 for s in STAGES}


def test_improvement_is_a_negative_drop_and_passes():
    d = gate(run(overall=0.5), run(overall=0.7))
    assert d.decision == "promote" and check(d, "overall").drop == pytest.approx(-0.2)


# (name of the failing check, baseline run, candidate at the bound, candidate past it)
BOUNDARIES = [
    ("overall", run(overall=0.60), run(overall=0.59), run(overall=0.589)),
    ("task", run(task=0.50), run(task=0.47), run(task=0.469)),
    (
        "track:detection",
        run(),
        run(tracks={"detection": 0.55, "segmentation": 0.60}),
        run(tracks={"detection": 0.549, "segmentation": 0.60}),
    ),
    *[
        (
            f"stage:{s}",
            run(),
            run(stages={**STAGES, s: 0.47}),
            run(stages={**STAGES, s: 0.469}),
        )
        for s in ("S3", "S4", "S5")
    ],
]


@pytest.mark.parametrize(
    ("name", "baseline", "at_bound", "past_bound"), BOUNDARIES, ids=[b[0] for b in BOUNDARIES]
)
def test_every_bound_passes_at_equality_and_fails_past_it(name, baseline, at_bound, past_bound):
    at = gate(baseline, at_bound)
    assert at.decision == "promote", at.table()
    assert check(at, name).passed
    past = gate(baseline, past_bound)
    assert past.decision == "hold"
    assert [c.name for c in past.failed] == [name]
    assert check(past, name).drop == pytest.approx(check(at, name).threshold + 0.001)


def test_unguarded_stage_may_drop():
    d = gate(run(), run(stages={**STAGES, "S1": 0.1, "S2": 0.1}))
    assert d.decision == "promote"
    assert d.regressions["S1"] == pytest.approx(0.6)


def test_guarded_stages_are_configurable():
    t = GateThresholds(guarded_stages=("S1",))
    d = gate(run(), run(stages={**STAGES, "S1": 0.5, "S3": 0.1}), t)
    assert d.decision == "hold"
    assert [c.name for c in d.failed] == ["stage:S1"]


def test_other_thresholds_are_configurable():
    loose = GateThresholds(max_overall_drop=0.05, max_task_drop=0.1)
    assert gate(run(), run(overall=0.56, task=0.41), loose).decision == "promote"


def test_catastrophic_at_the_bound_not_below_it():
    at = gate(run(overall=0.60), run(overall=0.40))
    assert at.decision == "catastrophic"
    cat = check(at, "catastrophic")
    assert not cat.passed and cat.drop == pytest.approx(0.20)
    below = gate(run(overall=0.60), run(overall=0.401))
    assert below.decision == "hold" and check(below, "catastrophic").passed


def test_catastrophic_threshold_is_configurable():
    t = GateThresholds(catastrophic_drop=0.1)
    assert gate(run(overall=0.60), run(overall=0.50), t).decision == "catastrophic"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"catastrophic_drop": 0.01},
        {"max_overall_drop": 0.3},
        {"guarded_stages": ("S3", "S3")},
        {"guarded_stages": ("stage3",)},
        {"max_task_drop": -0.1},
    ],
)
def test_inconsistent_thresholds_are_rejected(kwargs):
    with pytest.raises(ValueError):
        GateThresholds(**kwargs)


def test_unpaired_cells_are_refused():
    with pytest.raises(GateRefused, match="different cells") as info:
        gate(run(), run(digest="b" * 64))
    assert isinstance(info.value, BatGymError) and len(info.value.reasons) == 1


@pytest.mark.parametrize("who", ["baseline", "candidate"])
def test_invalid_cells_are_refused_naming_the_run(who):
    runs = {"baseline": run(), "candidate": run()}
    runs[who] = run(invalid=2)
    with pytest.raises(GateRefused, match=f"the {who} has 2 invalid cell"):
        gate(runs["baseline"], runs["candidate"])


def test_every_refusal_reason_is_listed():
    with pytest.raises(GateRefused) as info:
        gate(run(invalid=1), run(invalid=3, digest="b" * 64))
    assert len(info.value.reasons) == 3


def test_stage_null_in_both_is_skipped():
    stages = {**STAGES, "S4": None}
    d = gate(run(stages=stages), run(stages=stages))
    s4 = check(d, "stage:S4")
    assert d.decision == "promote" and s4.passed and s4.drop is None and "both" in s4.note
    assert d.regressions["S4"] is None


def test_guarded_stage_the_benchmark_lacks_is_skipped():
    three = {"S1": 0.5, "S2": 0.5, "S3": 0.5}
    d = gate(run(stages=three), run(stages=three))
    assert d.decision == "promote" and check(d, "stage:S5").note is not None


@pytest.mark.parametrize("who", ["baseline", "candidate"])
def test_stage_null_in_one_run_fails(who):
    runs = {"baseline": run(), "candidate": run()}
    runs[who] = run(stages={**STAGES, "S3": None})
    d = gate(runs["baseline"], runs["candidate"])
    s3 = check(d, "stage:S3")
    assert d.decision == "hold" and not s3.passed and f"the {who} only" in s3.note


def test_track_missing_from_one_run_fails():
    d = gate(run(), run(tracks={"detection": 0.6}))
    assert d.decision == "hold"
    assert [c.name for c in d.failed] == ["track:segmentation"]


def test_task_null_in_both_is_skipped():
    assert gate(run(task=None), run(task=None)).decision == "promote"


def test_overall_null_holds_and_is_not_catastrophic():
    both = gate(run(overall=None), run(overall=None))
    assert both.decision == "hold"
    assert {c.name for c in both.failed} == {"overall", "catastrophic"}
    one = gate(run(), run(overall=None))
    assert one.decision == "hold" and not check(one, "overall").passed


def test_regressions_cover_every_stage_in_stage_order():
    base = {"S10": 0.5, "S2": 0.4, "S1": 0.9, "S9": None}
    cand = {"S10": 0.3, "S2": 0.6, "S1": 0.9, "S9": 0.2}
    d = gate(run(stages=base), run(stages=cand))
    assert list(d.regressions) == ["S1", "S2", "S9", "S10"]
    assert d.regressions == {"S1": 0.0, "S2": -0.2, "S9": None, "S10": 0.2}
    assert d.candidate_stages["S9"] == 0.2 and d.baseline_stages["S9"] is None


def test_decision_round_trips_through_json():
    d = gate(run(), run(overall=0.5))
    assert GateDecision.model_validate_json(d.model_dump_json()) == d


def test_table_shows_numbers_and_decision():
    text = gate(run(), run(overall=0.58)).table()
    assert "overall" in text and "0.6000" in text and "0.5800" in text and "FAIL" in text
    assert text.splitlines()[-1] == "decision: hold"


# -- the command line ------------------------------------------------------------------


def write(tmp_path, name: str, aggs: Aggregates):
    folder = tmp_path / name
    folder.mkdir()
    aggs.write(folder / "aggregates.json")
    return folder


def invoke(*args):
    return runner.invoke(app, ["gate", *map(str, args)])


def test_cli_promote_prints_checks_and_target(tmp_path):
    b = write(tmp_path, "base", run())
    c = write(tmp_path, "cand", run(stages={**STAGES, "S2": 0.2}))
    result = invoke(b, c)
    assert result.exit_code == 0, result.output
    assert "stage:S3" in result.output and "decision: promote" in result.output
    assert "next target (paper): S2" in result.output


def test_cli_accepts_the_file_itself(tmp_path):
    b = write(tmp_path, "base", run())
    result = invoke(b / "aggregates.json", b / "aggregates.json")
    assert result.exit_code == 0, result.output


def test_cli_exit_codes(tmp_path):
    b = write(tmp_path, "base", run())
    hold = write(tmp_path, "hold", run(overall=0.58))
    cat = write(tmp_path, "cat", run(overall=0.3))
    unpaired = write(tmp_path, "unpaired", run(digest="c" * 64))
    invalid = write(tmp_path, "invalid", run(invalid=1))
    assert invoke(b, hold).exit_code == 1
    assert invoke(b, cat).exit_code == 3
    refused = invoke(b, unpaired)
    assert refused.exit_code == 4 and "different cells" in refused.stderr
    assert invoke(b, invalid).exit_code == 4
    assert invoke(b, tmp_path / "missing").exit_code == 4


def test_cli_json(tmp_path):
    b = write(tmp_path, "base", run())
    c = write(tmp_path, "cand", run(stages={**STAGES, "S4": 0.40}))
    result = invoke(b, c, "--json")
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    decision = GateDecision.model_validate(payload["gate"])
    assert decision.decision == "hold" and [c.name for c in decision.failed] == ["stage:S4"]
    # After a hold, the largest positive regression is the target.
    assert payload["selector"] == "paper" and payload["target"] == "S4"


def test_cli_threshold_options(tmp_path):
    b = write(tmp_path, "base", run())
    c = write(tmp_path, "cand", run(overall=0.57))
    assert invoke(b, c).exit_code == 1
    assert invoke(b, c, "--max-overall-drop", "0.03").exit_code == 0
    assert invoke(b, c, "--catastrophic-drop", "0.02").exit_code == 3
    assert invoke(b, c, "--catastrophic-drop", "0.005").exit_code == 2
    assert invoke(b, c, "--max-overall-drop", "1.5").exit_code == 2


def test_cli_guarded_stages(tmp_path):
    b = write(tmp_path, "base", run())
    c = write(tmp_path, "cand", run(stages={**STAGES, "S5": 0.1}))
    assert invoke(b, c).exit_code == 1
    assert invoke(b, c, "--guarded-stages", "S3,S4").exit_code == 0
    assert invoke(b, c, "--guarded-stages", "").exit_code == 0


def test_cli_selectors(tmp_path):
    b = write(tmp_path, "base", run())
    # Paper picks S5 (lowest); deficit picks S3 (0.35 * 0.4 > 0.10 * 0.7).
    cand = {"S1": 0.9, "S2": 0.9, "S3": 0.6, "S4": 0.9, "S5": 0.3}
    c = write(tmp_path, "cand", run(stages=cand))
    flags = ["--guarded-stages", "", "--json"]
    paper = json.loads(invoke(b, c, *flags).stdout)
    deficit = json.loads(invoke(b, c, *flags, "--selector", "deficit").stdout)
    assert (paper["target"], deficit["target"]) == ("S5", "S3")
    assert invoke(b, c, "--selector", "nope").exit_code == 2


def test_cli_progress_selector_keeps_its_state(tmp_path):
    b = write(tmp_path, "base", run())
    state = tmp_path / "selector.json"
    targets = []
    for _ in range(3):
        out = invoke(b, b, "--json", "--selector", "progress", "--selector-state", state)
        targets.append(json.loads(out.stdout)["target"])
    saved = json.loads(state.read_text())
    assert saved["selector"] == "progress" and saved["rounds"] == 3
    assert len(set(targets)) > 1  # untried stages come first, so it does not repeat S1


def test_cli_reports_when_no_stage_can_be_selected(tmp_path):
    nulls = dict.fromkeys(STAGES)
    b = write(tmp_path, "base", run(stages=nulls))
    result = invoke(b, b)
    assert result.exit_code == 0 and "next target (paper): none" in result.output
