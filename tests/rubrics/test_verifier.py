import hashlib
import json

import pytest

from bat_gym.envs.toy_pipeline.suite import SPEC
from bat_gym.rubrics.contract.model import ContractLibrary, RubricContract
from bat_gym.rubrics.verifier.verdict import Verdict, verify

from .conftest import LABELS, START, call

LIB = ContractLibrary.reference()
SUBMISSION = "id,label\ncase001,1\ncase002,0\ncase003,1\n"
PLAN = "# Plan\n## Preprocess\nunits\n## Inference\nrun\n## Postprocess\nwrite\n"


def receipt(stage, artifact, content):
    digest = hashlib.sha256(content.encode()).hexdigest()
    return json.dumps({"schema_version": 1, "stage": stage, "artifact": artifact, "sha256": digest})


def artifacts(pilot="id,label\ncase001,1\n"):
    """Every reference artifact, as the teacher writes them."""
    return {
        "plan/plan.md": PLAN,
        "setup/environment.json": '{"python": "3.11.9", "numpy": "2.1.0"}',
        "pipeline/infer.py": "print('infer')\n",
        "validation/pilot.csv": pilot,
        "validation/s3_validation.json": receipt("S3", "validation/pilot.csv", pilot),
        "outputs/predictions.csv": SUBMISSION,
        "validation/s4_completion.json": receipt("S4", "outputs/predictions.csv", SUBMISSION),
        "outputs/submission.csv": SUBMISSION,
        "validation/s5_submission.json": receipt("S5", "outputs/submission.csv", SUBMISSION),
    }


def pilot_files(pilot):
    return {
        "validation/pilot.csv": pilot,
        "validation/s3_validation.json": receipt("S3", "validation/pilot.csv", pilot),
    }


CALLS = [
    call(0, "cat > plan/plan.md <<EOF ... EOF"),
    call(1, "python write_setup.py setup/environment.json pipeline/infer.py"),
    call(
        2,
        "python pipeline/infer.py validation/pilot.csv case001 && receipt validation/s3_validation.json",
    ),
    call(
        3,
        "python pipeline/infer.py outputs/predictions.csv && receipt validation/s4_completion.json",
    ),
    call(
        4,
        "cp outputs/predictions.csv outputs/submission.csv && receipt validation/s5_submission.json",
    ),
]


def accuracy(ws):
    rows = dict(line.split(",") for line in ws.read_text("outputs/submission.csv").splitlines()[1:])
    return sum(int(rows.get(c, -1)) == y for c, y in LABELS.items()) / len(LABELS)


@pytest.fixture
def e2e(make_ctx):
    def run(files=None, *, calls=CALLS, answers=True, metric=accuracy):
        ctx = make_ctx(
            {**artifacts(), **(files or {})},
            calls=calls,
            answers={"labels": LABELS} if answers else None,
            metric=metric,
            spec=SPEC,
        )
        return verify(LIB.by_id("e2e"), ctx)

    return run


def stage_of(verdict, stage):
    return next(s for s in verdict.stages if s.stage == stage)


# -- E2E ----------------------------------------------------------------------------------


def test_a_complete_e2e_episode_earns_1(e2e):
    v = e2e()
    assert v.reward == 1.0 and v.task_score == 1.0 and v.stage_score == 1.0 and v.eta == 1.0
    assert [s.stage for s in v.stages] == ["S1", "S2", "S3", "S4", "S5"]
    # Stage-row-only items: the freeze, and the repair of a defective start state.
    assert all(
        s.skipped in (("earlier_unchanged",), ("earlier_unchanged", "upstream_repaired"))
        for s in v.stages
        if s.stage != "S1"
    )
    # This hand-built oracle has no reference run, no reproduction and no plan facts:
    # the checks against out-of-band truth are null, and say so; nothing else is.
    assert v.contract == LIB.by_id("e2e").ref
    assert all(n.split(":")[1].strip().startswith("null items") for n in v.notes), v.notes
    out_of_band = {"matches_reference", "pipeline_reproduces", "plan_states_facts", "pilot_checked"}
    nulls = {i.check for s in v.stages for i in s.items if i.passed is None}
    assert nulls == out_of_band


def test_e2e_reward_is_half_stage_mean_half_task(e2e):
    wrong = "id,label\ncase001,1\ncase002,1\ncase003,0\n"  # 1 of 3 right
    v = e2e(
        {
            # The submission is the predictions (stages_linked); this oracle has no
            # reference run, so only the task metric tells they are wrong.
            "outputs/predictions.csv": wrong,
            "validation/s4_completion.json": receipt("S4", "outputs/predictions.csv", wrong),
            "outputs/submission.csv": wrong,
            "validation/s5_submission.json": receipt("S5", "outputs/submission.csv", wrong),
        }
    )
    assert v.task_score == pytest.approx(1 / 3) and v.stage_score == 1.0
    assert v.reward == pytest.approx(0.5 * 1.0 + 0.5 * (1 / 3), abs=1e-12)


def test_e2e_weights_stages_by_the_spec(e2e):
    # A pilot with the wrong label: S3 reaches level 0.5, every other stage 1.
    pilot = "id,label\ncase001,0\n"
    v = e2e(artifacts(pilot))
    assert stage_of(v, "S3").score == 0.5
    stage_mean = 0.25 * 1 + 0.15 * 1 + 0.35 * 0.5 + 0.15 * 1 + 0.10 * 1  # weights sum to 1
    assert v.stage_score == pytest.approx(stage_mean, abs=1e-12)
    assert v.reward == pytest.approx(0.5 * stage_mean + 0.5 * 1.0, abs=1e-12)


def test_e2e_without_a_task_oracle_is_null_not_zero(e2e):
    v = e2e(answers=False, metric=None)
    assert v.reward is None and v.task_score is None
    assert "no task oracle: the task score is null" in v.notes
    # The pilot's quality check is null and excluded: S3 still reaches 1.0.
    s3 = stage_of(v, "S3")
    assert "pilot_quality" in s3.null_items and s3.score == 1.0
    assert any("S3: null items excluded" in n for n in v.notes)


def test_e2e_needs_the_spec_for_its_weights(make_ctx):
    with pytest.raises(ValueError, match="ctx.spec"):
        verify(LIB.by_id("e2e"), make_ctx(artifacts(), calls=CALLS))


# -- S3 levels ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "calls", "score"),
    [
        ({}, [call(0, "ls validation")], 0.0),
        # A hand-written pilot: the shape is right, nothing ran it.
        (
            {"validation/pilot.csv": "id,label\ncase001,1\n"},
            [call(0, "printf 'id,label\\ncase001,1\\n' > validation/pilot.csv")],
            0.2,
        ),
        # A real run with a receipt, but the pilot's label is wrong.
        (pilot_files("id,label\ncase001,0\n"), [CALLS[2]], 0.5),
        (pilot_files("id,label\ncase001,1\n"), [CALLS[2]], 1.0),
    ],
)
def test_s3_levels(make_ctx, files, calls, score):
    start = {
        **START,
        "plan/plan.md": PLAN,
        "setup/environment.json": "{}",
        "pipeline/infer.py": "x",
    }
    v = verify(
        LIB.by_id("s3_validate"),
        make_ctx(files, start=start, calls=calls, answers={"labels": LABELS}),
    )
    assert v.stages[0].score == score and v.reward == score


def test_s3_with_a_fake_receipt_stops_at_the_shape_level(make_ctx):
    pilot = "id,label\ncase001,1\n"
    fake = json.dumps(
        {"schema_version": 1, "stage": "S3", "artifact": "validation/pilot.csv", "sha256": "0" * 64}
    )
    v = verify(
        LIB.by_id("s3_validate"),
        make_ctx(
            {"validation/pilot.csv": pilot, "validation/s3_validation.json": fake},
            calls=[CALLS[2]],
            answers={"labels": LABELS},
        ),
    )
    items = {i.id: i for i in v.stages[0].items}
    assert items["pilot_receipt"].passed is False and "hashes to" in items["pilot_receipt"].detail
    assert v.reward == 0.2  # every other item passes, but 0.5 needs a true receipt


# -- gates, guards, nulls, eta --------------------------------------------------------------


def test_the_gate_caps_reward_at_0_without_a_successful_change(make_ctx):
    v = verify(
        LIB.by_id("s1_plan"),
        make_ctx({"plan/plan.md": PLAN}, calls=[call(0, "cat > plan/plan.md", exit_code=1)]),
    )
    assert v.stages[0].score == 1.0 and v.reward == 0.0
    assert v.gates[0].passed is False and "none of the 1 tool calls" in v.gates[0].reason
    assert "gate successful_change capped the reward at 0" in v.notes
    silent = verify(LIB.by_id("s1_plan"), make_ctx({"plan/plan.md": PLAN}))
    assert silent.reward == 0.0 and silent.gates[0].reason == "no tool call was made"


def test_a_failed_guard_zeroes_the_stage(make_ctx):
    files = {"plan/plan.md": PLAN, "data/cases.csv": "id,value\ncase001,1\n"}
    v = verify(
        LIB.by_id("s1_plan"), make_ctx(files, calls=[call(0, "cat > plan/plan.md; edit data")])
    )
    assert v.stages[0].score == 0.0 and v.reward == 0.0
    assert "S1: guard inputs_unchanged failed, so the stage scores 0" in v.notes


def test_guards_earn_no_credit_of_their_own(make_ctx):
    # A stray file passes the gate and keeps every input intact, and still earns nothing.
    v = verify(
        LIB.by_id("s5_submit"),
        make_ctx({"reward.json": '{"reward": 1.0}'}, calls=[call(0, "echo > reward.json")]),
    )
    assert v.gates[0].passed and v.reward == 0.0


CUSTOM = {
    "id": "custom",
    "version": "1",
    "focus": "S4",
    "items": [
        {"id": "a", "check": "file_exists", "args": {"path": "a.txt"}},
        {
            "id": "ran",
            "check": "command_ran",
            "args": {"mentions": ["make"]},
            "requires": ["execution"],
        },
        {"id": "b", "check": "file_exists", "args": {"path": "b.txt"}},
    ],
    "gates": ["successful_change"],
}


def test_null_items_are_excluded_and_the_verdict_says_so(make_ctx):
    contract = RubricContract.model_validate(CUSTOM)
    calls = [call(0, "echo a > a.txt"), call(1, "make all", restarted=True)]
    v = verify(contract, make_ctx({"a.txt": "a"}, calls=calls))
    assert [i.passed for i in v.stages[0].items] == [True, None, False]
    assert v.stages[0].null_items == ("ran",) and v.stages[0].score == 0.5 and v.reward == 0.5
    assert "S4: null items excluded from the score: ran" in v.notes


def test_a_stage_whose_items_are_all_null_is_null(make_ctx):
    contract = RubricContract.model_validate({**CUSTOM, "items": [CUSTOM["items"][1]]})
    v = verify(
        contract, make_ctx({"x": "1"}, calls=[call(0, "echo > x"), call(1, "make", restarted=True)])
    )
    assert v.stages[0].score is None and v.reward is None
    assert "S4: every item is null, so the stage is unscored" in v.notes


def test_eta_discounts_passes_that_lack_the_evidence_they_require(make_ctx):
    # environment.json was already there at the start: it is valid, but no call of this
    # episode produced it, so its pass has artifact evidence and no execution evidence.
    start = {
        **START,
        "plan/plan.md": PLAN,
        "setup/environment.json": '{"python": "3", "numpy": "2"}',
    }
    ctx = make_ctx(
        {"pipeline/infer.py": "print(1)\n"},
        start=start,
        calls=[call(0, "cat > pipeline/infer.py")],
        spec=SPEC,
    )
    v = verify(LIB.by_id("s2_setup"), ctx)
    items = {i.id: i for i in v.stages[0].items}
    assert items["environment_json"].passed and not items["environment_json"].evidence_complete
    assert items["pipeline_present"].passed and items["pipeline_present"].evidence_complete
    assert items["setup_written"].passed is False
    # passed: environment_json, pipeline_present and the two guards; complete: 3 of 4
    assert v.eta == 0.75 and v.stages[0].score == pytest.approx(2 / 3)
    assert v.reward == pytest.approx(2 / 3 * 0.75, abs=1e-12)


def test_a_verdict_is_plain_data(e2e):
    v = e2e()
    assert Verdict.model_validate_json(v.model_dump_json()) == v


def test_an_infrastructure_fault_in_the_task_metric_makes_the_e2e_verdict_null(e2e):
    from bat_gym.core.errors import SnapshotNotFound

    def lost_blob(ws):
        raise SnapshotNotFound("blob gone")

    v = e2e(metric=lost_blob)
    assert v.reward is None and v.task_score is None
    assert any(n.startswith("infrastructure fault while computing the task score") for n in v.notes)


def test_a_verdict_summarises_in_one_line_and_explains_item_by_item(e2e, make_ctx):
    v = e2e()
    line = v.summary()
    assert "\n" not in line and str(v) == line and len(line) < 300
    assert line.startswith("E2E reward 1.000: stage credit S1 1.00, S2 1.00")
    assert "task score 1.000" in line and f"sha256 {v.contract.sha256[:12]}" in line
    text = v.explain()
    assert text.splitlines()[0] == line
    assert "S1 (s1_plan): credit 1.00 = score 1.00 x evidence completeness 1.00" in text
    # Every item gets its own line, null ones marked as such.
    assert sum(len(s.items) for s in v.stages) == sum(
        ln.startswith(("  pass ", "  FAIL ", "  null ")) for ln in text.splitlines()
    )
    assert "  null " in text and "note: " in text
    closed = verify(
        LIB.by_id("s1_plan"),
        make_ctx({"plan/plan.md": PLAN}, calls=[call(0, "cat > plan/plan.md", exit_code=1)]),
    )
    assert "gate successful_change closed" in closed.summary()
    assert "gate successful_change: closed, none of the 1 tool calls" in closed.explain()
