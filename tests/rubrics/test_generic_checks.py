"""The benchmark-generic checks: schemas from task.json, real pipeline runs, spec artifacts,
and the benchmark's pilot metric."""

import json
import re
from dataclasses import replace

import pytest

from bat_gym.core.errors import PluginError, RubricContractError
from bat_gym.core.record import ProgramRun
from bat_gym.core.spec import ContractRef
from bat_gym.envs.skill_ladder.tasks import label_accuracy
from bat_gym.envs.toy_pipeline.suite import SPEC
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import Evidence, TaskOracle
from bat_gym.rubrics.contract.model import ContractLibrary
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.invocation import runs_script

from .conftest import CASES, LABELS, START, call

SUBMISSION = "id,label\ncase001,1\ncase002,0\ncase003,1\n"
FROM_TASK = {"file": "task.json", "key": "submission.columns"}


# -- csv_schema columns from the task's own files ------------------------------------------


def test_csv_schema_reads_the_columns_from_the_start_task_json(make_ctx):
    wide = {"submission": {"columns": ["id", "label", "confidence"], "case_ids": CASES}}
    start = {**START, "task.json": json.dumps(wide)}
    args = {"path": "outputs/submission.csv", "columns": FROM_TASK}
    rows = "".join(f"{c},1,0.9\n" for c in CASES)
    ok = make_ctx({"outputs/submission.csv": "id,label,confidence\n" + rows}, start=start)
    assert run_check("csv_schema", ok, args).passed is True
    res = run_check(
        "csv_schema", make_ctx({"outputs/submission.csv": SUBMISSION}, start=start), args
    )
    assert res.passed is False and "expected exactly ['id', 'label', 'confidence']" in res.detail


def test_an_agent_editing_task_json_does_not_change_the_schema(make_ctx):
    # The agent rewrites task.json to match its own output; the start snapshot decides.
    edited = json.dumps({"submission": {"columns": ["id", "guess"], "case_ids": CASES}})
    ctx = make_ctx({"task.json": edited, "outputs/submission.csv": "id,guess\ncase001,1\n"})
    res = run_check("csv_schema", ctx, {"path": "outputs/submission.csv", "columns": FROM_TASK})
    assert res.passed is False and "expected exactly ['id', 'label']" in res.detail


def test_columns_missing_from_the_start_state_are_null(make_ctx):
    start = {**START, "task.json": json.dumps({"submission": {"case_ids": CASES}})}
    ctx = make_ctx({"outputs/submission.csv": SUBMISSION}, start=start)
    res = run_check("csv_schema", ctx, {"path": "outputs/submission.csv", "columns": FROM_TASK})
    assert res.passed is None and "submission.columns" in res.detail


# -- pipeline_ran ---------------------------------------------------------------------------

RAN = {"entry": "pipeline/infer.py", "writes": ["validation/pilot.csv"]}
PILOT = {"validation/pilot.csv": "id,label\ncase001,1\n"}


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("bash", "python pipeline/infer.py validation/pilot.csv case001"),
        ("bash", "cd /workspace && python3 -u ./pipeline/infer.py validation/pilot.csv case001"),
        ("bash", "python -m pipeline.infer validation/pilot.csv"),
        (
            "bash",
            "python - <<'EOF'\nimport runpy\nrunpy.run_path('pipeline/infer.py')\n# pilot.csv\nEOF",
        ),
        (
            "python",
            "import sys\nsys.path.insert(0, 'pipeline')\nimport infer\n"
            "infer.run(['case001'], 'validation/pilot.csv', None)",
        ),
        ("python", "from pipeline import infer\ninfer.run(['case001'], 'validation/pilot.csv')"),
        (
            "python",
            "import subprocess, sys\nsubprocess.run([sys.executable, 'pipeline/infer.py', "
            "'validation/pilot.csv'], check=True)",
        ),
        (
            "python",
            "import os\nos.system('timeout 60 python pipeline/infer.py validation/pilot.csv')",
        ),
        (
            "python",
            "import subprocess\nsubprocess.run(['python', 'pipeline/infer.py', "
            "'validation/pilot.csv', 'case001'], check=True)",
        ),
    ],
)
def test_pipeline_ran_recognizes_real_runs(make_ctx, language, code):
    c = call(0, code).model_copy(update={"language": language})
    res = run_check("pipeline_ran", make_ctx(PILOT, calls=[c]), RAN)
    assert res.passed is True, res.detail
    assert Evidence.execution(0) in res.evidence and "artifact" in res.kinds


@pytest.mark.parametrize(
    ("language", "code"),
    [
        # A plan that describes the run, written with a heredoc.
        ("bash", "cat > plan/plan.md <<'EOF'\npython pipeline/infer.py validation/pilot.csv\nEOF"),
        # Writing the pipeline names it; it does not run it.
        ("python", "open('pipeline/infer.py', 'w').write('print(1)')\n# validation/pilot.csv"),
        (
            "python",
            "open('plan/plan.md', 'w').write('run pipeline/infer.py into validation/pilot.csv')",
        ),
        # A hand-written pilot.
        ("bash", "printf 'id,label\\ncase001,1\\n' > validation/pilot.csv"),
        # Echoing the command line into the pilot is not running it.
        ("bash", "echo 'python pipeline/infer.py validation/pilot.csv' > validation/pilot.csv"),
        (
            "python",
            "import subprocess\nsubprocess.run(['cp', 'pipeline/infer.py', 'validation/pilot.csv'])",
        ),
        # import infer without its folder: some other module
        ("python", "import infer\ninfer.run(['case001'], 'validation/pilot.csv')"),
    ],
)
def test_pipeline_ran_is_not_fooled_by_mentions(make_ctx, language, code):
    c = call(0, code).model_copy(update={"language": language})
    res = run_check("pipeline_ran", make_ctx(PILOT, calls=[c]), RAN)
    assert res.passed is False and "no call running pipeline/infer.py" in res.detail


def test_pipeline_ran_needs_success_a_change_and_the_file_written(make_ctx):
    run = "python pipeline/infer.py validation/pilot.csv case001"
    failed = run_check("pipeline_ran", make_ctx(PILOT, calls=[call(0, run, exit_code=1)]), RAN)
    assert failed.passed is False and "exited 1" in failed.detail
    idle = run_check("pipeline_ran", make_ctx(PILOT, calls=[call(0, run, changed=False)]), RAN)
    assert idle.passed is False and "did not change the workspace" in idle.detail
    # The run succeeded, but the pilot is the one the state started with.
    stale = make_ctx(start={**START, **PILOT}, calls=[call(0, run)])
    res = run_check("pipeline_ran", stale, RAN)
    assert res.passed is False and "not written in this episode" in res.detail
    cut = run_check("pipeline_ran", make_ctx(PILOT, calls=[call(0, run, restarted=True)]), RAN)
    assert cut.passed is None and "restart" in cut.detail


# -- pipeline_ran on what the sandbox observed ------------------------------------------

PY = "/usr/bin/python3"


def observed(
    index,
    code,
    runs,
    *,
    writes=("validation/pilot.csv",),
    reads=("pipeline/infer.py",),
    language="bash",
    exit_code=0,
):
    """A call record with the sandbox's observation: ``runs`` are (argv, exit, cwd) triples."""
    return call(index, code, exit_code=exit_code).model_copy(
        update={
            "language": language,
            "runs": [
                ProgramRun(
                    path=PY if a[0].startswith("python") else a[0], argv=a, cwd=cwd, exit_code=rc
                )
                for a, rc, cwd in runs
            ],
            "writes": list(writes),
            "reads": list(reads),
        }
    )


@pytest.mark.parametrize(
    "argv, cwd",
    [
        (["python", "pipeline/infer.py", "validation/pilot.csv"], "/workspace"),
        (["python3", "-u", "./infer.py"], "/workspace/pipeline"),
        (["python3", "/workspace/pipeline/infer.py"], "/tmp"),
        (["python", "-m", "pipeline.infer"], "/workspace"),
        (["pipeline/infer.py", "validation/pilot.csv"], "/workspace"),  # exec'd directly
    ],
)
def test_an_observed_run_of_the_script_counts(make_ctx, argv, cwd):
    c = observed(0, "anything at all", [(argv, 0, cwd)])
    res = run_check("pipeline_ran", make_ctx(PILOT, calls=[c]), RAN)
    assert res.passed is True, res.detail
    assert "ran" in res.detail and Evidence.execution(0) in res.evidence


def test_code_that_looks_like_a_run_is_not_one_the_sandbox_saw(make_ctx):
    # A shell function named python "runs" the script as far as the code's text goes.
    code = "python() { :; }; python pipeline/infer.py validation/pilot.csv; echo id,label > validation/pilot.csv"
    c = observed(0, code, [])
    res = run_check("pipeline_ran", make_ctx(PILOT, calls=[c]), RAN)
    assert res.passed is False and "saw no run of it that exited 0" in res.detail


@pytest.mark.parametrize(
    "argv, cwd, rc",
    [
        (["python", "/tmp/pipeline/infer.py"], "/workspace", 0),  # a look-alike copy
        (["python", "pipeline/infer.py"], "/tmp", 0),  # another directory's script
        (["python", "pipeline/infer.py"], "/workspace", 1),  # the run failed
        (["python", "-m", "pipeline.infer"], "/tmp", 0),
        (["/usr/bin/true", "pipeline/infer.py"], "/workspace", 0),  # named, not run
        (["cat", "pipeline/infer.py"], "/workspace", 0),
        (["python", "-c", "print(1)", "pipeline/infer.py"], "/workspace", 0),  # an argument
        (["python", "other.py", "pipeline/infer.py"], "/workspace", 0),
    ],
)
def test_runs_of_something_else_do_not_count(make_ctx, argv, cwd, rc):
    c = observed(0, "python pipeline/infer.py validation/pilot.csv", [(argv, rc, cwd)])
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[c]), RAN).passed is False


def test_a_run_the_record_saw_no_read_of_the_script_for_is_not_one(make_ctx):
    argv = ["python", "pipeline/infer.py", "validation/pilot.csv"]
    unread = observed(
        0, "python pipeline/infer.py validation/pilot.csv", [(argv, 0, "/workspace")], reads=()
    )
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[unread]), RAN).passed is False
    # Where reads were not observed (lost events), the run alone decides.
    lost = unread.model_copy(update={"reads": None})
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[lost]), RAN).passed is True


def test_the_run_and_the_write_must_be_one_call(make_ctx):
    ran = observed(
        0,
        "python pipeline/infer.py /tmp/p.csv",
        [(["python", "pipeline/infer.py", "/tmp/p.csv"], 0, "/workspace")],
        writes=(),
    )
    copied = observed(
        1,
        "cp /tmp/p.csv validation/pilot.csv",
        [(["cp", "/tmp/p.csv", "validation/pilot.csv"], 0, "/workspace")],
    )
    res = run_check("pipeline_ran", make_ctx(PILOT, calls=[ran, copied]), RAN)
    assert res.passed is False and "did not write validation/pilot.csv" in res.detail


def test_a_python_call_counts_when_it_read_the_script_and_its_code_runs_it(make_ctx):
    code = "import runpy, sys; sys.argv = ['x', 'validation/pilot.csv']; runpy.run_path('pipeline/infer.py')"
    read = observed(0, code, [], reads=("pipeline/infer.py",), language="python")
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[read]), RAN).passed is True
    # Python loads fresh cached bytecode instead of the source: that read counts too.
    cached = observed(
        0, code, [], reads=("pipeline/__pycache__/infer.cpython-311.pyc",), language="python"
    )
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[cached]), RAN).passed is True
    # The same code without the read (it ran some other copy) is not a run.
    unread = observed(0, code, [], reads=(), language="python")
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[unread]), RAN).passed is False
    # A bash call's interpreter is a program run: an import inside `python -c` that
    # the record shows reading the script is not a run of it.
    imported = observed(
        0,
        "python3 -c 'import sys; sys.path.insert(0, \"pipeline\"); import infer' || true",
        [
            (
                ["python3", "-c", "import sys; sys.path.insert(0, 'pipeline'); import infer"],
                1,
                "/workspace",
            )
        ],
        reads=("pipeline/infer.py",),
    )
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[imported]), RAN).passed is False
    # Reading it without running it is not either.
    cat = observed(
        0,
        "print(open('pipeline/infer.py').read())",
        [],
        reads=("pipeline/infer.py",),
        language="python",
    )
    assert run_check("pipeline_ran", make_ctx(PILOT, calls=[cat]), RAN).passed is False


def test_runs_script_reads_python_c_and_ignores_unparsable_code():
    assert runs_script(
        "python -c \"import runpy; runpy.run_path('pipeline/infer.py')\"",
        "bash",
        "pipeline/infer.py",
    )
    assert not runs_script("import infer (", "python", "pipeline/infer.py")
    assert runs_script("import infer", "python", "infer.py")  # a script at the root


def test_runs_script_treats_code_too_deep_to_parse_as_running_nothing():
    # The parser runs out of stack on very deep nesting (MemoryError, not SyntaxError):
    # a hostile call like this is "ran nothing", never an exception out of the check.
    deep = "-" * 200_000 + "1\nimport runpy; runpy.run_path('pipeline/infer.py')"
    assert not runs_script(deep, "python", "pipeline/infer.py")
    assert not runs_script("not " * 200_000 + "x", "python", "pipeline/infer.py")


# -- stage_artifacts_written ------------------------------------------------------------------


def test_stage_artifacts_come_from_the_benchmark_spec(make_ctx):
    files = {"setup/environment.json": "{}", "pipeline/infer.py": "print(1)\n"}
    calls = [call(0, "write setup/environment.json pipeline/infer.py")]
    ok = run_check(
        "stage_artifacts_written", make_ctx(files, calls=calls, spec=SPEC), {"stage": "S2"}
    )
    assert ok.passed is True and "setup/environment.json, pipeline/infer.py" in ok.detail
    partial = make_ctx({"pipeline/infer.py": "x"}, calls=calls, spec=SPEC)
    res = run_check("stage_artifacts_written", partial, {"stage": "S2"})
    assert res.passed is False and "setup/environment.json is missing" in res.detail
    assert (
        run_check("stage_artifacts_written", make_ctx(files, calls=calls), {"stage": "S2"}).passed
        is None
    )
    unknown = run_check(
        "stage_artifacts_written", make_ctx(files, calls=calls, spec=SPEC), {"stage": "S9"}
    )
    assert unknown.passed is None


# -- pilot_quality -------------------------------------------------------------------------------

QUALITY = {"path": "validation/pilot.csv", "threshold": 0.9}


def test_pilot_quality_asks_the_benchmark_and_applies_the_threshold(make_ctx):
    right = make_ctx({"validation/pilot.csv": "id,label\ncase001,1\n"}, answers={"labels": LABELS})
    res = run_check("pilot_quality", right, QUALITY)
    assert res.passed is True and "1.000 >= 0.9" in res.detail
    wrong = make_ctx({"validation/pilot.csv": "id,label\ncase001,0\n"}, answers={"labels": LABELS})
    res = run_check("pilot_quality", wrong, QUALITY)
    assert res.passed is False and "0.000 < 0.9" in res.detail and "label" not in res.detail
    # A pilot on something that is not a case validates nothing.
    off = make_ctx({"validation/pilot.csv": "id,label\nzzz,1\n"}, answers={"labels": LABELS})
    assert run_check("pilot_quality", off, QUALITY).passed is False
    missing = run_check("pilot_quality", make_ctx(answers={"labels": LABELS}), QUALITY)
    assert missing.passed is False and "missing" in missing.detail


def test_pilot_quality_is_null_without_an_oracle_or_a_pilot_metric(make_ctx):
    files = {"validation/pilot.csv": "id,label\ncase001,1\n"}
    assert run_check("pilot_quality", make_ctx(files), QUALITY).passed is None
    no_metric = make_ctx(files, metric=lambda ws: 1.0)  # an oracle, but no pilot metric
    assert run_check("pilot_quality", no_metric, QUALITY).passed is None


def test_the_pilot_metric_is_cached_and_range_checked(make_ctx):
    seen = []
    oracle = TaskOracle(lambda: {}, lambda ws: None, lambda ws, path: seen.append(path) or 0.5)
    ctx = make_ctx({"validation/pilot.csv": "id,label\ncase001,1\n"})
    assert oracle.pilot_score(ctx.workspace, "validation/pilot.csv") == 0.5
    assert oracle.pilot_score(ctx.workspace, "validation/pilot.csv") == 0.5 and len(seen) == 1
    bad = TaskOracle(lambda: {}, lambda ws: None, lambda ws, path: 2.0)
    with pytest.raises(ValueError, match="pilot metric returned 2.0"):
        bad.pilot_score(ctx.workspace, "validation/pilot.csv")


# -- pilot_quality held to the reference run on the same case(s) ---------------------------------

# The reference run (a correct pipeline with an imperfect model) gets case004 wrong, as
# a wrong pipeline does, but with another label: its task score is 0.75, and 0 there.
TRUTH = {"case001": 1, "case002": 0, "case003": 1, "case004": 0}
REFERENCE_ROWS = {"case001": 1, "case002": 0, "case003": 1, "case004": 2}
RELATIVE = {"path": "validation/pilot.csv", "threshold": 0.9, "relative": True}
AGREE = {**RELATIVE, "below_floor_agree": ["outputs/submission.csv"]}


def _csv(rows):
    return "id,label\n" + "".join(f"{c},{v}\n" for c, v in rows.items())


def _relative_ctx(make_ctx, store, pilot_rows, *, per_case=True, reference=True):
    """A context whose oracle has a reference run and, with ``per_case``, the hook."""
    ctx = make_ctx({"validation/pilot.csv": _csv(pilot_rows)})
    ref_ws = FrozenWorkspace.from_files(store, {"outputs/submission.csv": _csv(REFERENCE_ROWS)})

    def on_cases(ref, ws, path):
        # As a benchmark would: the reference's own rows for the ids the pilot names.
        ids = [line.split(",")[0] for line in ws.read_text(path).splitlines()[1:]]
        return label_accuracy(ref, "outputs/submission.csv", TRUTH, scored=ids)

    oracle = TaskOracle(
        lambda: {},
        lambda ws: label_accuracy(ws, "outputs/submission.csv", TRUTH, scored=list(TRUTH)),
        lambda ws, path: label_accuracy(ws, path, TRUTH, scored=None),
        reference=(lambda: ref_ws) if reference else None,
        pilot_reference=on_cases if per_case else None,
    )
    return replace(ctx, task=oracle)


def _quality(make_ctx, store, rows, args=RELATIVE, **kw):
    return run_check("pilot_quality", _relative_ctx(make_ctx, store, rows, **kw), args)


def test_a_correct_pilot_on_cases_the_model_does_worse_on_than_its_mean_passes(make_ctx, store):
    # The model's rows on case003 and case004 score 0.5, below 0.9 of its task score
    # (0.675): held to the whole task a correct pilot fails; as the reference's own rows
    # on cases where the reference is below its task score, it passes.
    correct = {"case003": 1, "case004": 2}
    whole = _quality(make_ctx, store, correct, per_case=False)
    assert whole.passed is False and "0.500 < 0.675" in whole.detail
    res = _quality(make_ctx, store, correct, AGREE)
    assert res.passed is True and "0.500 meets the bar" in res.detail
    # With a floor of 0.5 the metric bar alone (0.9 * 0.5) lets it through.
    assert _quality(make_ctx, store, correct, {**RELATIVE, "floor": 0.5}).passed is True
    # A wrong pipeline on the same cases still fails.
    assert _quality(make_ctx, store, {"case003": 0, "case004": 1}, AGREE).passed is False


def test_a_pilot_cannot_lower_its_bar_by_choosing_the_references_worst_case(make_ctx, store):
    # The reference scores 0 on case004: without the floor the bar would be 0 and a
    # wrong pilot there would pass; with it the bar is 0.9 * 0.75.
    wrong_on_worst = {"case004": 1}
    res = _quality(make_ctx, store, wrong_on_worst, AGREE)
    assert res.passed is False and "0.000 is below the bar" in res.detail
    assert _quality(make_ctx, store, wrong_on_worst, {**RELATIVE, "floor": 0.0}).passed is True
    # Without below_floor_agree, being the reference's own rows does not lift it.
    assert _quality(make_ctx, store, {"case004": 2}).passed is False
    # A pilot that is right there clears the floored bar.
    assert _quality(make_ctx, store, {"case004": 0}, AGREE).passed is True


def test_a_mistake_scoring_like_the_model_on_a_middling_case_fails(make_ctx, store):
    # On case003 + case004 the reference scores 0.5, and so does a mistake that gets
    # case004 wrong its own way: a bar of 0.9 * 0.5 (floor 0.5) lets it through, the
    # default floor (the whole-task bar) does not, and its rows are not the reference's.
    mistake = {"case003": 1, "case004": 1}
    assert _quality(make_ctx, store, mistake, {**AGREE, "floor": 0.5}).passed is True
    assert _quality(make_ctx, store, mistake, AGREE).passed is False


def test_below_the_floor_a_pilot_passes_only_as_the_references_own_rows(make_ctx, store):
    # On case004 the metric cannot tell the model's output (2) from a mistake (1): both
    # score 0. With below_floor_agree, the model's own rows pass and the mistake fails.
    assert _quality(make_ctx, store, {"case004": 2}, AGREE).passed is True
    assert _quality(make_ctx, store, {"case004": 1}, AGREE).passed is False
    assert _quality(make_ctx, store, {"case004": 2, "case002": 1}, AGREE).passed is False
    # At or above the floor agreement buys nothing: the per-case bar applies as it is.
    assert _quality(make_ctx, store, {"case001": 0}, AGREE).passed is False
    # Nor on something that is not a case.
    assert _quality(make_ctx, store, {"case009": 2}, AGREE).passed is False


def test_the_per_case_bar_is_never_said(make_ctx, store):
    # The bar would tell how the reference does on the piloted case; the detail gives
    # the pilot's own score only.
    for rows in ({"case003": 1, "case004": 2}, {"case004": 1}, {"case001": 1}, {"case004": 2}):
        for args in (RELATIVE, AGREE):
            res = _quality(make_ctx, store, rows, args)
            assert len(re.findall(r"\d\.\d+", res.detail)) == 1, res.detail
            assert "label" not in res.detail


def test_the_relative_bar_falls_back_without_a_per_case_reference(make_ctx, store):
    # No hook: the reference's whole-task score (0.9 * 0.75), said as before.
    res = _quality(make_ctx, store, {"case001": 1}, per_case=False)
    assert res.passed is True and "1.000 >= 0.675" in res.detail
    # No reference run at all: the plain threshold.
    res = _quality(make_ctx, store, {"case004": 1}, reference=False)
    assert res.passed is False and "0.000 < 0.900" in res.detail
    # Not relative: the plain threshold, whatever the reference does.
    res = _quality(make_ctx, store, {"case003": 1, "case004": 2}, {**RELATIVE, "relative": False})
    assert res.passed is False and "0.500 < 0.900" in res.detail
    # A pilot on something that is not a case scores 0 whatever the bar.
    assert _quality(make_ctx, store, {"zzz": 1}).passed is False


def test_the_per_case_reference_metric_is_range_checked(make_ctx, store):
    ctx = _relative_ctx(make_ctx, store, {"case001": 1})
    bad = TaskOracle(
        lambda: {},
        lambda ws: 1.0,
        lambda ws, path: 1.0,
        reference=lambda: ctx.workspace,
        pilot_reference=lambda ref, ws, path: 1.5,
    )
    with pytest.raises(PluginError, match="pilot reference metric returned 1.5"):
        bad.pilot_reference_score(ctx.workspace, "validation/pilot.csv")
    assert TaskOracle(lambda: {}, lambda ws: 1.0).pilot_reference_score(ctx.workspace, "x") is None


# The refs a Stage Bank built before the per-case pilot bar pins (s3_validate and e2e 1.4).
_BEFORE_PER_CASE_BAR = [
    ("s3_validate", "1.4", "73d89fbeb1e37cef3c9b5432ae20cb83ee72ad6288a822aec51d8f4227ebb9db"),
    ("e2e", "1.4", "3800e6a0ddd8fee3e2135ebf0a728fba1b4c3fd6eabbba6b7cdb8c5bfbea516c"),
]


@pytest.mark.parametrize("contract_id, version, sha256", _BEFORE_PER_CASE_BAR)
def test_a_bank_scored_under_the_whole_task_pilot_bar_is_refused(contract_id, version, sha256):
    lib = ContractLibrary.reference()
    ref = ContractRef(id=contract_id, version=version, sha256=sha256)
    with pytest.raises(RubricContractError, match="Rebuild the Stage Bank"):
        lib.get(ref)
    s3 = next(i for i in lib.by_id("s3_validate").items if i.id == "pilot_quality")
    assert s3.args["relative"] is True and s3.args["floor"] == 1.0
    assert s3.args["below_floor_agree"] == ["outputs/predictions.csv", "validation/pilot.csv"]


def test_below_the_floor_a_named_file_must_agree_not_just_its_name(make_ctx, store):
    # The reference's row names a file; a pilot naming the same path with other
    # contents is not the reference's output.
    ref_files = {
        "outputs/submission.csv": "id,label,mask\ncase004,2,outputs/case004.txt\n",
        "outputs/case004.txt": "model output\n",
    }
    ref_ws = FrozenWorkspace.from_files(store, ref_files)
    args = {**AGREE, "floor": 1.0}

    def ctx_with(contents):
        pilot = "id,label,mask\ncase004,2,outputs/case004.txt\n"
        ctx = make_ctx({"validation/pilot.csv": pilot, "outputs/case004.txt": contents})
        oracle = TaskOracle(
            lambda: {},
            lambda ws: 0.75,
            lambda ws, path: 0.0,
            reference=lambda: ref_ws,
            pilot_reference=lambda ref, ws, path: 0.0,
        )
        return replace(ctx, task=oracle)

    assert run_check("pilot_quality", ctx_with("model output\n"), args).passed is True
    assert run_check("pilot_quality", ctx_with("a transposed output\n"), args).passed is False
