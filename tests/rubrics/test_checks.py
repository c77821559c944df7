import hashlib
import json

import pytest

from bat_gym.core.errors import CheckNotFound
from bat_gym.core.sandbox.snapshot import Entry, Snapshot
from bat_gym.rubrics.contract.checks import check_names, get_check, register_check, run_check
from bat_gym.rubrics.contract.context import CheckContext, CheckResult, Evidence
from bat_gym.rubrics.contract.workspace import MAX_READ_BYTES, FrozenWorkspace

from .conftest import CASES, LABELS, START, call


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def receipt(artifact, content, stage="S3", **override):
    return json.dumps(
        {
            "schema_version": 1,
            "stage": stage,
            "artifact": artifact,
            "sha256": sha(content),
            **override,
        }
    )


SUBMISSION = "id,label\ncase001,1\ncase002,0\ncase003,1\n"
WRITE = call(0, "python pipeline/infer.py outputs/submission.csv")


def test_the_registry_lists_every_builtin_and_suggests_close_names():
    assert {
        "file_exists",
        "file_nonempty",
        "json_valid",
        "csv_schema",
        "markdown_sections",
        "receipt_valid",
        "command_ran",
        "pipeline_ran",
        "written_by_tool",
        "stage_artifacts_written",
        "pilot_quality",
        "non_degenerate",
        "unchanged",
        "task_metric_at_least",
        "matches_answers",
    } <= set(check_names())
    with pytest.raises(CheckNotFound, match="Did you mean 'file_exists'"):
        get_check("file_exist")


def test_a_benchmark_author_registers_a_check(make_ctx):
    @register_check("test_author_has_readme")
    def has_readme(ctx: CheckContext, *, name: str = "README.md") -> CheckResult:
        ok = ctx.workspace.exists(name)
        return CheckResult(passed=ok, detail=name)

    assert run_check("test_author_has_readme", make_ctx({"README.md": "x"}), {}).passed is True
    assert run_check("test_author_has_readme", make_ctx(), {"name": "NOTES"}).passed is False
    with pytest.raises(ValueError, match="already registered"):
        register_check("file_exists")(has_readme)
    with pytest.raises(TypeError, match="keyword-only"):
        register_check("test_author_positional")(lambda ctx, path: None)


# -- files ------------------------------------------------------------------------------


def test_file_exists_points_at_the_file_and_the_call_that_wrote_it(make_ctx):
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION}, calls=[WRITE])
    res = run_check("file_exists", ctx, {"path": "outputs/submission.csv"})
    assert res.passed is True
    assert res.evidence == (
        Evidence.artifact("outputs/submission.csv", sha(SUBMISSION)),
        Evidence.execution(0),
    )
    missing = run_check("file_exists", ctx, {"path": "outputs/predictions.csv"})
    assert missing.passed is False and "missing" in missing.detail


def test_a_symlink_is_not_a_file(store, make_ctx):
    base = make_ctx({"real.csv": SUBMISSION})
    link = (
        Entry("outputs", "d", 0o755, "", 0),
        Entry("outputs/submission.csv", "l", 0o777, sha("../real.csv"), 10),
    )
    store.put_bytes(b"../real.csv")
    snap = Snapshot.of([*base.workspace.snapshot.entries, *link])
    ctx = CheckContext(FrozenWorkspace(snap, store), base.start, base.record)
    res = run_check("file_exists", ctx, {"path": "outputs/submission.csv"})
    assert res.passed is False and "symlink" in res.detail


def test_file_nonempty(make_ctx):
    ctx = make_ctx({"pipeline/infer.py": "print(1)\n", "pipeline/empty.py": " \n\t\n"})
    assert run_check("file_nonempty", ctx, {"path": "pipeline/infer.py"}).passed is True
    assert run_check("file_nonempty", ctx, {"path": "pipeline/empty.py"}).passed is False


def test_files_past_the_read_limit_fail_instead_of_loading(make_ctx):
    ctx = make_ctx({"big.txt": b"x" * (MAX_READ_BYTES + 1)})
    res = run_check("file_nonempty", ctx, {"path": "big.txt"})
    assert res.passed is False and "limit" in res.detail


def test_json_valid_with_required_keys_and_types(make_ctx):
    ctx = make_ctx(
        {
            "setup/environment.json": '{"python": "3.11", "numpy": "2.0", "cores": 4}',
            "setup/bad.json": '{"python": 3.11, "cores": true}',
            "setup/list.json": "[1, 2]",
            "setup/broken.json": '{"python": ',
        }
    )
    ok = run_check(
        "json_valid",
        ctx,
        {"path": "setup/environment.json", "keys": {"python": "string", "cores": "integer"}},
    )
    assert ok.passed is True
    bad = run_check(
        "json_valid",
        ctx,
        {
            "path": "setup/bad.json",
            "keys": {"python": "string", "cores": "integer", "numpy": "string"},
        },
    )
    assert bad.passed is False
    assert (
        "python (not string)" in bad.detail
        and "cores (not integer)" in bad.detail
        and "numpy (missing)" in bad.detail
    )
    assert run_check("json_valid", ctx, {"path": "setup/list.json"}).passed is True
    assert (
        run_check("json_valid", ctx, {"path": "setup/list.json", "keys": {"a": "any"}}).passed
        is False
    )
    broken = run_check("json_valid", ctx, {"path": "setup/broken.json"})
    assert broken.passed is False and "not valid JSON" in broken.detail


# -- CSV ----------------------------------------------------------------------------------

IDS = {"file": "task.json", "key": "submission.case_ids"}
SCHEMA = {
    "path": "outputs/submission.csv",
    "columns": ["id", "label"],
    "types": {"label": "int"},
    "case_ids": IDS,
}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (SUBMISSION, None),
        ("id,label\ncase001,1\ncase002,0\n", "missing ids: case003"),
        (SUBMISSION + "case001,1\n", "duplicated ids: case001"),
        (SUBMISSION + "case999,0\n", "unexpected ids: case999"),
        ("label,id\n1,case001\n0,case002\n1,case003\n", "expected exactly ['id', 'label']"),
        ("id,label\ncase001,yes\ncase002,0\ncase003,1\n", "label='yes' is not int"),
        ("id,label\ncase001,1,extra\ncase002,0\ncase003,1\n", "line 2 has 3 fields"),
        ("", "empty"),
        (b"id,label\n\xff\xfe,1\n", "not UTF-8"),
    ],
)
def test_csv_schema(make_ctx, content, expected):
    res = run_check("csv_schema", make_ctx({"outputs/submission.csv": content}), SCHEMA)
    if expected is None:
        assert res.passed is True, res.detail
    else:
        assert res.passed is False and expected in res.detail


def test_csv_schema_allowed_values_subset_coverage_and_extra_columns(make_ctx):
    ctx = make_ctx({"validation/pilot.csv": "id,label,score\ncase002,0,0.1\n"})
    args = {
        "path": "validation/pilot.csv",
        "columns": ["id", "label"],
        "exact_columns": False,
        "case_ids": IDS,
        "coverage": "subset",
    }
    assert run_check("csv_schema", ctx, args).passed is True
    assert run_check("csv_schema", ctx, {**args, "exact_columns": True}).passed is False
    assert (
        run_check(
            "csv_schema", ctx, {**args, "allowed": {"label": [1]}, "types": {"label": "int"}}
        ).passed
        is False
    )
    assert (
        run_check(
            "csv_schema", ctx, {**args, "allowed": {"label": [0, 1]}, "types": {"label": "int"}}
        ).passed
        is True
    )
    assert run_check("csv_schema", ctx, {**args, "min_rows": 2}).passed is False


def test_expected_ids_come_from_the_start_workspace_not_the_agents_copy(make_ctx):
    # The agent rewrites task.json to drop a case it did not predict: still missing.
    forged = json.dumps({"submission": {"case_ids": CASES[:2]}})
    ctx = make_ctx(
        {"task.json": forged, "outputs/submission.csv": "id,label\ncase001,1\ncase002,0\n"}
    )
    res = run_check("csv_schema", ctx, SCHEMA)
    assert res.passed is False and "missing ids: case003" in res.detail


def test_csv_schema_is_null_when_the_start_state_lacks_the_ids(make_ctx):
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION}, start={"data/x": "1"})
    res = run_check("csv_schema", ctx, SCHEMA)
    assert res.passed is None and "start workspace" in res.detail


def test_non_degenerate(make_ctx):
    args = {
        "path": "outputs/predictions.csv",
        "column": "label",
        "inputs": [{"file": "data/cases.csv", "column": "value"}],
    }
    assert (
        run_check("non_degenerate", make_ctx({"outputs/predictions.csv": SUBMISSION}), args).passed
        is True
    )
    constant = run_check(
        "non_degenerate",
        make_ctx({"outputs/predictions.csv": "id,label\ncase001,1\ncase002,1\ncase003,1\n"}),
        args,
    )
    assert constant.passed is False and "constant" in constant.detail
    copied = "id,label\ncase001,4.2\ncase002,0.3\ncase003,9.9\n"
    copy = run_check("non_degenerate", make_ctx({"outputs/predictions.csv": copied}), args)
    assert copy.passed is False and "copies data/cases.csv:value" in copy.detail


# -- markdown and receipts ----------------------------------------------------------------

PLAN_ARGS = {"path": "plan/plan.md", "sections": ["Preprocess", "Inference", "Postprocess"]}


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ("# Plan\n## Preprocessing\nunits\n## Inference\nrun\n## Postprocess\nwrite\n", None),
        ("## Preprocess\nunits\n## Inference\nrun\n", "no 'Postprocess' heading"),
        (
            "## Preprocess\n\n## Inference\nrun\n## Postprocess\nwrite\n",
            "'Preprocess' section is empty",
        ),
        (
            "## Preprocess\nx\n```\n## Inference\n```\n## Postprocess\nwrite\n",
            "no 'Inference' heading",
        ),
    ],
)
def test_markdown_sections(make_ctx, plan, expected):
    res = run_check("markdown_sections", make_ctx({"plan/plan.md": plan}), PLAN_ARGS)
    assert res.passed is (expected is None)
    if expected:
        assert expected in res.detail


PILOT = "id,label\ncase001,1\n"
RECEIPT_ARGS = {
    "path": "validation/s3_validation.json",
    "artifact": "validation/pilot.csv",
    "stage": "S3",
}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (receipt("validation/pilot.csv", PILOT), None),
        (receipt("/workspace/validation/pilot.csv", PILOT), None),
        (receipt("validation/pilot.csv", PILOT, sha256="0" * 64), "hashes to"),
        (receipt("validation/pilot.csv", "something else"), "hashes to"),
        (receipt("validation/pilot.csv", PILOT, stage="S4"), "for stage 'S4'"),
        (receipt("outputs/predictions.csv", PILOT), "names artifact"),
        (
            json.dumps({"stage": "S3", "artifact": "validation/pilot.csv"}),
            "lacks ['schema_version', 'sha256']",
        ),
        (receipt("validation/pilot.csv", PILOT, sha256="abc"), "not 64 hex"),
        ("[]", "not a JSON object"),
    ],
)
def test_receipt_valid(make_ctx, content, expected):
    ctx = make_ctx({"validation/pilot.csv": PILOT, "validation/s3_validation.json": content})
    res = run_check("receipt_valid", ctx, RECEIPT_ARGS)
    assert res.passed is (expected is None), res.detail
    if expected is None:
        paths = {e.path for e in res.evidence if e.kind == "artifact"}
        assert paths == {"validation/pilot.csv", "validation/s3_validation.json"}
    else:
        assert expected in res.detail


def test_a_receipt_for_a_missing_artifact_fails(make_ctx):
    ctx = make_ctx({"validation/s3_validation.json": receipt("validation/pilot.csv", PILOT)})
    res = run_check("receipt_valid", ctx, RECEIPT_ARGS)
    assert res.passed is False and "not in the workspace" in res.detail


# -- execution ----------------------------------------------------------------------------

RAN = {"mentions": ["pipeline/infer.py", "pilot"], "changed_workspace": True}


def test_command_ran_needs_a_matching_call_that_exited_0(make_ctx):
    good = call(1, "python pipeline/infer.py validation/pilot.csv case001")
    res = run_check("command_ran", make_ctx(calls=[call(0, "ls"), good]), RAN)
    assert res.passed is True and res.evidence == (Evidence.execution(1),)
    failed = run_check("command_ran", make_ctx(calls=[call(0, good.code, exit_code=1)]), RAN)
    assert failed.passed is False and "exited 1" in failed.detail
    assert (
        run_check(
            "command_ran", make_ctx(calls=[call(0, "python pipeline/infer.py out.csv")]), RAN
        ).passed
        is False
    )
    timed_out = run_check("command_ran", make_ctx(calls=[call(0, good.code, timed_out=True)]), RAN)
    assert timed_out.passed is False and "timed out" in timed_out.detail


def test_an_echo_that_mentions_the_pipeline_changes_nothing_and_fails(make_ctx):
    echo = call(0, "echo 'python pipeline/infer.py validation/pilot.csv: OK'", changed=False)
    res = run_check("command_ran", make_ctx(calls=[echo]), RAN)
    assert res.passed is False and "did not change the workspace" in res.detail
    assert (
        run_check("command_ran", make_ctx(calls=[echo]), {"mentions": ["pipeline/infer.py"]}).passed
        is True
    )


def test_command_ran_is_null_when_the_sandbox_restarted_during_the_matching_call(make_ctx):
    res = run_check(
        "command_ran",
        make_ctx(calls=[call(0, "python pipeline/infer.py validation/pilot.csv", restarted=True)]),
        RAN,
    )
    assert res.passed is None and "restart" in res.detail


def test_written_by_tool(make_ctx):
    args = {"paths": ["outputs/submission.csv"]}
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION}, calls=[WRITE])
    assert run_check("written_by_tool", ctx, args).passed is True
    present = make_ctx(start={**START, "outputs/submission.csv": SUBMISSION}, calls=[WRITE])
    res = run_check("written_by_tool", present, args)
    assert res.passed is False and "unchanged since the start" in res.detail
    assert run_check("written_by_tool", make_ctx(calls=[WRITE]), args).passed is False


def test_the_writer_is_the_last_successful_changing_call_that_names_the_file(make_ctx):
    calls = [
        call(0, "python pipeline/infer.py outputs/submission.csv"),
        call(1, "python other.py"),
        call(2, "cp x outputs/submission.csv", exit_code=1),
    ]
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION}, calls=calls)
    assert ctx.writer("outputs/submission.csv").index == 0
    # Written only by a failing call: no execution evidence for the artifact.
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION}, calls=[calls[2]])
    assert ctx.writer("outputs/submission.csv") is None
    assert {e.kind for e in ctx.artifact("outputs/submission.csv")} == {"artifact"}


def test_unchanged(make_ctx):
    args = {"paths": ["data/", "task.json"]}
    ok = run_check("unchanged", make_ctx({"outputs/x": "1"}), args)
    assert ok.passed is True and {e.path for e in ok.evidence} == {"data/cases.csv", "task.json"}
    edited = run_check("unchanged", make_ctx({"data/cases.csv": "id,value\n"}), args)
    assert edited.passed is False and "data/cases.csv" in edited.detail
    removed = run_check("unchanged", make_ctx({"task.json": None}), args)
    assert removed.passed is False and "task.json" in removed.detail
    nothing = run_check("unchanged", make_ctx(), {"paths": ["plan/"]})
    assert nothing.passed is None


# -- the task oracle ----------------------------------------------------------------------


def test_task_metric_at_least(make_ctx):
    ctx = make_ctx(metric=lambda ws: 0.75)
    assert run_check("task_metric_at_least", ctx, {"threshold": 0.7}).passed is True
    assert run_check("task_metric_at_least", ctx, {"threshold": 0.8}).passed is False
    assert run_check("task_metric_at_least", make_ctx(), {"threshold": 0.5}).passed is None
    assert (
        run_check(
            "task_metric_at_least", make_ctx(metric=lambda ws: None), {"threshold": 0.5}
        ).passed
        is None
    )


def test_the_oracle_is_lazy_and_cached(make_ctx):
    seen = []
    ctx = make_ctx(metric=lambda ws: seen.append(ws.digest) or 1.0)
    run_check("file_exists", ctx, {"path": "task.json"})
    assert seen == []
    for _ in range(2):
        run_check("task_metric_at_least", ctx, {"threshold": 0.5})
    assert len(seen) == 1
    with pytest.raises(ValueError, match="expected None or a number in"):
        make_ctx(metric=lambda ws: 1.5).task.score(ctx.workspace)


def test_matches_answers_never_reveals_the_answers(make_ctx):
    args = {"path": "validation/pilot.csv", "answers_key": "labels"}
    right = make_ctx(
        {"validation/pilot.csv": "id,label\ncase001,1\ncase002,0\n"}, answers={"labels": LABELS}
    )
    assert run_check("matches_answers", right, args).passed is True
    wrong = make_ctx({"validation/pilot.csv": "id,label\ncase001,0\n"}, answers={"labels": LABELS})
    res = run_check("matches_answers", wrong, args)
    assert res.passed is False
    assert (
        res.detail
        == "validation/pilot.csv: 1 of 1 rows disagree with the private answers (lines 2)"
    )
    unknown = make_ctx({"validation/pilot.csv": "id,label\nzzz,1\n"}, answers={"labels": LABELS})
    assert run_check("matches_answers", unknown, args).passed is False
    assert (
        run_check("matches_answers", make_ctx({"validation/pilot.csv": PILOT}), args).passed is None
    )


def test_a_missing_blob_is_an_infrastructure_null_not_a_failure(make_ctx, store):
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION})
    store.blob_path(sha(SUBMISSION)).unlink()
    res = run_check("csv_schema", ctx, SCHEMA)
    assert res.passed is None and "infrastructure" in res.detail


# -- checks that rest on no evidence -------------------------------------------------------


def test_a_check_declared_evidence_free_earns_full_credit_and_refuses_required_evidence(
    make_ctx,
):
    from bat_gym.core.errors import SpecError
    from bat_gym.core.spec import load_model
    from bat_gym.rubrics.contract.checks import check_evidence, register_check
    from bat_gym.rubrics.contract.context import CheckResult
    from bat_gym.rubrics.contract.model import RubricContract
    from bat_gym.rubrics.verifier.verdict import verify

    @register_check("metric_positive_for_test", evidence="none")
    def metric_positive(ctx):
        return CheckResult.ok("the verifier's own metric is positive")

    assert check_evidence("task_metric_at_least") == "none"  # the built-in one
    assert check_evidence("file_exists") == "required"
    contract = RubricContract.model_validate(
        {
            "id": "metric_only",
            "version": "1",
            "focus": "S4",
            "items": [
                {"id": "good", "check": "task_metric_at_least", "args": {"threshold": 0.5}},
                {"id": "mine", "check": "metric_positive_for_test"},
            ],
        }
    )
    assert [i.requires for i in contract.items] == [(), ()]
    verdict = verify(contract, make_ctx(metric=lambda ws: 0.9))
    (stage,) = verdict.stages
    # Under the artifact default these passes would count as unproven: eta 0, credit 0.
    assert stage.score == 1.0 and stage.eta == 1.0 and stage.credit == 1.0
    asks_evidence = {
        "id": "bad",
        "version": "1",
        "focus": "S4",
        "items": [
            {
                "id": "good",
                "check": "task_metric_at_least",
                "args": {"threshold": 0.5},
                "requires": ["artifact"],
            }
        ],
    }
    with pytest.raises(SpecError, match="returns no evidence") as exc:
        load_model(RubricContract, asks_evidence, origin="bad.yaml")
    assert "drop requires" in str(exc.value)
    with pytest.raises(ValueError, match="'required' or 'none'"):
        register_check("metric_other_for_test", evidence="some")
