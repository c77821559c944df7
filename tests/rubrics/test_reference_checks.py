"""Checks against out-of-band truth: the reference run, and the pipeline run again."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from bat_gym.core.protocol import get_protocol
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reference import reference_workspace

from .conftest import START, call

PREDICTIONS = "id,label\ncase001,1\ncase002,0\ncase003,1\n"
REFERENCE = {
    **START,
    "outputs/predictions.csv": PREDICTIONS,
    "outputs/submission.csv": PREDICTIONS,
    "outputs/masks/case001.bin": "\x01\x02",
    "outputs/with_files.csv": "id,mask,volume_ml\ncase001,outputs/masks/case001.bin,12.5\n",
    "validation/pilot.csv": "id,label\nphantom,0\n",
    "setup/environment.json": json.dumps({"python": "3.11.7", "numpy": "2.4.1"}),
}


@pytest.fixture
def ctx_for(store):
    """A context whose final workspace is ``START`` plus ``files``, with a reference run."""

    def make(files, *, reproduced=None, files_agree=None):
        ref = FrozenWorkspace.from_files(store, REFERENCE)
        final = FrozenWorkspace.from_files(store, {**START, **files})
        again = (
            None
            if reproduced is None
            else FrozenWorkspace.from_files(store, {**START, **reproduced})
        )
        oracle = TaskOracle(
            lambda: {},
            lambda ws: None,
            reference=lambda: ref,
            files_agree=files_agree,
            reproduce=None if reproduced is None else (lambda ws, outputs, settled: again),
        )
        return CheckContext(
            workspace=final,
            start=FrozenWorkspace.from_files(store, START),
            record=_record(),
            task=oracle,
        )

    return make


def _record():
    from bat_gym.core.record import ExecutionRecord

    record = ExecutionRecord(start_digest="0" * 64)
    record.append(call(0, "python pipeline/infer.py outputs/predictions.csv"))
    return record


def rows(path="outputs/predictions.csv", **args):
    return {"path": path, "mode": "rows", **args}


def test_predictions_that_are_the_models_outputs_pass(ctx_for):
    ctx = ctx_for({"outputs/predictions.csv": PREDICTIONS})
    assert run_check("matches_reference", ctx, rows(complete=True)).passed is True


@pytest.mark.parametrize(
    "predictions",
    [
        "id,label\ncase001,0\ncase002,0\ncase003,1\n",  # one label is not the model's
        "id,label\ncase001,1\ncase002,0\n",  # shape right, a case missing
        "id,label\ncase001,1\ncase002,0\ncase003,1\nextra,1\n",  # a case the model never saw
        "label,id\n1,case001\n0,case002\n1,case003\n",  # keyed otherwise
    ],
)
def test_look_alike_predictions_fail(ctx_for, predictions):
    ctx = ctx_for({"outputs/predictions.csv": predictions})
    assert run_check("matches_reference", ctx, rows(complete=True)).passed is False


def test_numbers_agree_within_float_printing_and_files_by_content(ctx_for):
    mine = "id,mask,volume_ml\ncase001,outputs/mine/001.bin,12.50000000000001\n"
    ctx = ctx_for({"outputs/with_files.csv": mine, "outputs/mine/001.bin": "\x01\x02"})
    assert run_check("matches_reference", ctx, rows("outputs/with_files.csv")).passed is True
    wrong_file = ctx_for({"outputs/with_files.csv": mine, "outputs/mine/001.bin": "\x01\x03"})
    assert (
        run_check("matches_reference", wrong_file, rows("outputs/with_files.csv")).passed is False
    )
    wrong_number = mine.replace("12.50000000000001", "12.6")
    ctx = ctx_for({"outputs/with_files.csv": wrong_number, "outputs/mine/001.bin": "\x01\x02"})
    assert run_check("matches_reference", ctx, rows("outputs/with_files.csv")).passed is False


def test_a_benchmark_decides_when_two_encodings_of_a_file_agree(ctx_for):
    mine = "id,mask,volume_ml\ncase001,outputs/mine/001.bin,12.5\n"
    files = {"outputs/with_files.csv": mine, "outputs/mine/001.bin": "\x01\x02\x00"}
    strict = ctx_for(files)
    assert run_check("matches_reference", strict, rows("outputs/with_files.csv")).passed is False
    lenient = ctx_for(files, files_agree=lambda path, a, b: a.rstrip(b"\x00") == b)
    assert run_check("matches_reference", lenient, rows("outputs/with_files.csv")).passed is True


def test_a_pilot_row_must_be_the_models_row_of_its_case(ctx_for):
    args = rows("validation/pilot.csv", against=["outputs/predictions.csv", "validation/pilot.csv"])
    assert run_check(
        "matches_reference", ctx_for({"validation/pilot.csv": "id,label\ncase002,0\n"}), args
    ).passed
    assert run_check(
        "matches_reference", ctx_for({"validation/pilot.csv": "id,label\nphantom,0\n"}), args
    ).passed
    guessed = ctx_for({"validation/pilot.csv": "id,label\ncase002,1\n"})
    assert run_check("matches_reference", guessed, args).passed is False


def test_recorded_facts_must_be_the_real_ones(ctx_for):
    args = {"path": "setup/environment.json", "mode": "json", "keys": ["python", "numpy", "torch"]}
    real = json.dumps({"python": "Python 3.11.7 (main)", "numpy": "2.4.1"})
    assert run_check("matches_reference", ctx_for({"setup/environment.json": real}), args).passed
    for made_up in ({"python": "3.11", "numpy": "2.4.1"}, {"python": "3.11.7"}):
        ctx = ctx_for({"setup/environment.json": json.dumps(made_up)})
        assert run_check("matches_reference", ctx, args).passed is False


def test_without_a_reference_the_checks_are_null(store):
    ctx = CheckContext(
        workspace=FrozenWorkspace.from_files(store, START),
        start=FrozenWorkspace.from_files(store, START),
        record=_record(),
        task=TaskOracle(lambda: {}, lambda ws: None),
    )
    assert run_check("matches_reference", ctx, rows()).passed is None
    assert run_check("pipeline_reproduces", ctx, {"path": "outputs/predictions.csv"}).passed is None


def test_the_shipped_pipeline_must_reproduce_the_models_outputs(ctx_for):
    ok = ctx_for(
        {"outputs/predictions.csv": PREDICTIONS},
        reproduced={"outputs/predictions.csv": PREDICTIONS},
    )
    assert run_check("pipeline_reproduces", ok, {"path": "outputs/predictions.csv"}).passed is True
    # The file was right, but the pipeline left in the workspace does not make it.
    hand_written = ctx_for({"outputs/predictions.csv": PREDICTIONS}, reproduced={})
    result = run_check("pipeline_reproduces", hand_written, {"path": "outputs/predictions.csv"})
    assert result.passed is False and "run again" in result.detail


# -- through the env, on toy_pipeline ------------------------------------------------------

HERMES = get_protocol("hermes")


FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


def test_the_reference_run_is_cached_per_task(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    task = toy.make_task(toy.spec.tracks[0].name, toy.seeds("train")[0], "train")
    first = reference_workspace(toy, task)
    assert first is not None and first.exists("outputs/predictions.csv")
    assert list((tmp_path / "cache" / "references" / toy.name).glob("*.ref"))


def test_another_interpreter_or_numpy_does_not_reuse_the_reference_run(toy, monkeypatch):
    # Two venvs share one cache (a framework's venv beside the dev one): a run that
    # recorded python 3.12 and another numpy must not judge this interpreter's episodes.
    import importlib.metadata
    import platform

    from bat_gym.rubrics.verifier import reference

    task = toy.make_task(toy.spec.tracks[0].name, toy.seeds("train")[0], "train")
    here = reference.reference_key(toy, task, "d" * 64)
    assert here == reference.reference_key(toy, task, "d" * 64)
    real_version = importlib.metadata.version

    for patch in (
        lambda mp: mp.setattr(platform, "python_version", lambda: "3.99.0"),
        lambda mp: mp.setattr(
            importlib.metadata,
            "version",
            lambda d: "0.0.1" if d == "numpy" else real_version(d),
        ),
    ):
        with monkeypatch.context() as mp:
            patch(mp)
            reference._runtime_of.cache_clear()
            assert reference.reference_key(toy, task, "d" * 64) != here
        reference._runtime_of.cache_clear()
    assert reference.reference_key(toy, task, "d" * 64) == here


def test_hand_written_predictions_with_a_real_receipt_earn_nothing_on_infer(toy, toy_bank):
    env = gym.make("bat/Infer-v0", benchmark="toy_pipeline", states=toy_bank)
    try:
        state_id = toy_bank.select(focus="S4")[0]
        env.reset(options={"state_id": state_id})
        junk = (
            "import json, hashlib, os, csv\n"
            "ids = json.load(open('task.json'))['submission']['case_ids']\n"
            "os.makedirs('outputs', exist_ok=True)\n"
            "w = csv.writer(open('outputs/predictions.csv', 'w')); w.writerow(['id', 'score'])\n"
            "[w.writerow([i, '0.5000']) for i in ids]\n"
            "del w\n"
            "d = hashlib.sha256(open('outputs/predictions.csv', 'rb').read()).hexdigest()\n"
            "json.dump({'schema_version': 1, 'stage': 'S4', 'artifact': 'outputs/predictions.csv', 'sha256': d,"
            " 'cases': len(ids), 'completed': len(ids)}, open('validation/s4_completion.json', 'w'))\n"
        )
        env.step(HERMES.render("", [_py(junk)]))
        _, reward, *_, info = env.step(FINISH)
        verdict = info["verdict"]
        failed = {i.id for s in verdict.stages for i in s.items if i.passed is False}
        assert reward == 0.0 and "predictions_are_model_outputs" in failed, verdict.notes
    finally:
        env.close()


def _py(code):
    from bat_gym.core.protocol import ToolCall

    return ToolCall(name="execute_code", arguments={"language": "python", "code": code})


def test_a_number_agrees_with_the_same_value_printed_to_other_precision(ctx_for):
    ref = "id,label\ncase001,1\ncase002,0\ncase003,1\n"
    honest = ctx_for({"outputs/predictions.csv": ref.replace("case001,1", "case001,1.0000000001")})
    assert run_check("matches_reference", honest, rows()).passed is True
    # A cell printed without a decimal point is exact: "1" is not "1.4".
    made_up = ctx_for({"outputs/predictions.csv": ref.replace("case001,1", "case001,1.4")})
    assert run_check("matches_reference", made_up, rows()).passed is False


def test_a_fact_may_be_recorded_under_another_key(ctx_for):
    args = {"path": "setup/environment.json", "mode": "json", "keys": ["numpy|packages.numpy"]}
    nested = json.dumps({"python": "3.11.7", "packages": {"numpy": "2.4.1"}})
    assert run_check("matches_reference", ctx_for({"setup/environment.json": nested}), args).passed
    wrong = json.dumps({"packages": {"numpy": "1.26.0"}})
    assert (
        run_check("matches_reference", ctx_for({"setup/environment.json": wrong}), args).passed
        is False
    )


def test_the_teachers_own_run_on_the_pristine_task_is_adopted_as_the_reference(
    toy, tmp_path, monkeypatch
):
    from bat_gym.bank import build_bank
    from bat_gym.rubrics.verifier import reference

    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    runs = []
    real_run = reference._run
    monkeypatch.setattr(reference, "_run", lambda *a: runs.append(a) or real_run(*a))
    bank = build_bank(toy, tmp_path / "bank", tasks_per_track=1)
    assert not bank.manifest["rejected"]
    assert runs == []  # every task's reference came from its teacher episode
    assert len(list((tmp_path / "cache" / "references" / toy.name).glob("*.ref"))) == len(
        toy.spec.tracks
    )


@pytest.mark.parametrize(
    "cell", ["/etc/passwd", "../../outputs/masks/case001.bin", "outputs/masks"]
)
def test_a_cell_naming_a_file_outside_the_workspace_or_a_directory_disagrees(ctx_for, cell):
    mine = f"id,mask,volume_ml\ncase001,{cell},12.5\n"
    ctx = ctx_for({"outputs/with_files.csv": mine})
    assert run_check("matches_reference", ctx, rows("outputs/with_files.csv")).passed is False


# -- the reproductions' scratch directories --------------------------------------------------


def _reproduce_in_child(queue):
    from bat_gym.core.scratch import scratch_dir
    from bat_gym.rubrics.verifier import reference

    # What reproduce() keeps per reproduction: its result and its blob directory.
    tmp = scratch_dir("reproduce-")
    reference._REPRO[("task", "start", ("outputs/x",))] = (None, tmp)
    queue.put((tmp, sorted(t for _, t in reference._REPRO.values())))


def test_a_multiprocessing_child_deletes_its_reproductions_and_not_its_parents(tmp_path):
    import multiprocessing
    import os

    from bat_gym.rubrics.verifier import reference

    # A pool worker or an env subprocess leaves through os._exit, which skips atexit.
    parents = tmp_path / "parents-reproduction"
    parents.mkdir()
    reference._REPRO[("parent", "start", ())] = (None, str(parents))
    try:
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_reproduce_in_child, args=(queue,))
        child.start()
        made, seen = queue.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0
        assert seen == [made]  # the parent's table is not the child's
        assert not os.path.exists(made)
        assert parents.is_dir()
    finally:
        reference._REPRO.pop(("parent", "start", ()), None)


def test_a_teacher_run_with_an_unattributed_change_is_not_adopted_as_the_reference(
    toy, toy_bank, tmp_path, monkeypatch
):
    """Unattributed paths are removed before scoring: such a run is missing files."""
    from bat_gym.core.protocol import get_protocol
    from bat_gym.rubrics.verifier import reference
    from bat_gym.rubrics.verifier.reward import make_env

    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    runs = []
    real_run = reference._run
    monkeypatch.setattr(reference, "_run", lambda *a: runs.append(a) or real_run(*a))
    state_id = toy_bank.select(focus="E2E", outcome="success")[0]
    env = make_env("E2E", benchmark=toy, states=toy_bank)
    try:
        env.reset(options={"state_id": state_id})
        base = env.unwrapped
        task = toy.task_of_state(base.state)
        turns = toy.teacher_script(task, "success")
        proto = get_protocol("hermes")
        for n, turn in enumerate(turns):
            if n == 1:  # something outside any call writes into the workspace
                (base.sandbox.workspace / "late.txt").write_text("nobody's work")
            *_, info = env.step(proto.render(turn.content, list(turn.calls)))
        assert info["record"].unattributed == ["late.txt"]
        # Not adopted: the verifier played the reference script itself.
        assert len(runs) == 1, "a run missing files became the reference"
    finally:
        env.close()


def test_what_a_benchmark_omits_from_reproductions_is_not_seen_and_costs_no_run(
    toy, tmp_path, monkeypatch
):
    # MedBench-Lite's reproduction deletes validation/ before it runs: a stage that only
    # adds notes there must reuse the earlier stage's run, not pay for another one.
    from bat_gym.rubrics.verifier import reference

    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    task = toy.make_task(toy.spec.tracks[0].name, toy.seeds("train")[0], "train")
    ref = reference_workspace(toy, task)
    outputs = ["outputs/predictions.csv"]
    assert reference.reproduce(toy, task, ref, outputs) is not None  # the reference's reads
    noted = FrozenWorkspace.from_files(
        ref.store, {**{p: ref.read_bytes(p) for p in ref.paths()}, "notes/why.md": "a note"}
    )
    seen: list[list[str]] = []  # the files each reproduction's sandbox started from
    real = reference.make_sandbox

    def counted(*args, **kwargs):
        box = real(*args, **kwargs)
        restore = box.restore

        def restore_and_count(snapshot):
            seen.append([e.path for e in snapshot.entries])
            return restore(snapshot)

        box.restore = restore_and_count
        return box

    monkeypatch.setattr(reference, "make_sandbox", counted)
    omitting = type("Omitting", (type(toy),), {"reproduction_omits": ("notes/",)})()
    again = reference.reproduce(omitting, task, noted, outputs)
    assert again is not None and again.snapshot.digest == ref.snapshot.digest and seen == []
    # Without the declaration the note is part of what the pipeline may read: a new run.
    ran = reference.reproduce(toy, task, noted, outputs)
    assert ran is not None and len(seen) == 1 and "notes/why.md" in seen[0]


def test_callers_that_want_the_same_reference_run_share_one_run(toy, tmp_path, monkeypatch):
    # A bank build plays a failure trajectory's reference run in a thread beside the
    # trajectory, whose verifier then asks for it too: one run serves both.
    import threading
    import time

    from bat_gym.rubrics.verifier import reference

    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    task = toy.make_task(toy.spec.tracks[0].name, toy.seeds("train")[0], "train")
    real, runs = reference._run, []

    def slow_run(*args, **kwargs):
        runs.append(1)
        time.sleep(0.5)  # long enough for the second caller to arrive meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "_run", slow_run)
    got = []
    callers = [
        threading.Thread(target=lambda: got.append(reference_workspace(toy, task)))
        for _ in range(2)
    ]
    for c in callers:
        c.start()
    for c in callers:
        c.join(120)
    assert len(runs) == 1 and len(got) == 2 and got[0] is got[1] is not None
