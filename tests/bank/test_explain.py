"""A bank build tells the truth: holes fail it, and every task's verdict can be read."""

import pytest
from typer.testing import CliRunner

from bat_gym.catalog import register_benchmark, unregister_benchmark
from bat_gym.cli import app

runner = CliRunner()


def toy_variant(name, *, drop_submit, outcomes=("success",), only_failure_submits=False):
    """A toy benchmark under ``name``; with ``drop_submit`` its teacher never submits.

    With ``only_failure_submits`` the ``failure`` teacher still does (it plays the
    whole workflow, only labelled otherwise).
    """
    from bat_gym.envs.toy_pipeline.suite import SPEC, ToyPipeline

    class Variant(ToyPipeline):
        spec = SPEC.model_copy(update={"name": name})

        def teacher_turns(self, task, outcome="success"):
            turns = super().teacher_turns(task)
            drop = drop_submit and not (only_failure_submits and outcome == "failure")
            return [t for i, t in enumerate(turns) if i != 4] if drop else turns

    Variant.outcomes = outcomes
    return Variant()


@pytest.fixture
def bench_named():
    names = []

    def register(name, **kwargs):
        register_benchmark(name, toy_variant(name, **kwargs))
        names.append(name)
        return name

    yield register
    for name in names:
        unregister_benchmark(name)


def test_a_build_that_leaves_a_track_empty_exits_1_with_each_verdict(bench_named, tmp_path):
    name = bench_named("toy_nosubmit", drop_submit=True)
    out = tmp_path / "bank"
    result = runner.invoke(app, ["bank", "build", "--out", str(out), "--benchmark", name])
    assert result.exit_code == 1, result.output
    text = result.output
    for track in ("threshold", "lookup"):
        assert (
            f"{track}/0/success: rejected: success below 0.95 of the reward of a correct run"
            in text
        )
    assert "evidence completeness (eta) 1.00" in text
    assert "S5.submission_schema (csv_schema) failed: outputs/submission.csv" in text
    assert "error: no states for 12 focus/track cell(s): S1/threshold" in text


def test_a_build_with_every_cell_filled_exits_0_though_some_tasks_were_rejected(
    bench_named, tmp_path
):
    # The success trajectories fail, the failure ones fill every cell: nothing is missing.
    name = bench_named(
        "toy_halfgood",
        drop_submit=True,
        outcomes=("success", "failure"),
        only_failure_submits=True,
    )
    out = tmp_path / "bank"
    args = ["bank", "build", "--out", str(out), "--benchmark", name]
    result = runner.invoke(app, [*args, "--outcome", "success", "--outcome", "failure"])
    assert result.exit_code == 0, result.output
    assert "rejected: {'success below 0.95 of the reward of a correct run': 2}" in result.output
    # explain shows any task's verdict: the rejected ones by default, a kept one on request.
    shown = runner.invoke(app, ["bank", "explain", str(out)])
    assert shown.exit_code == 0, shown.output
    assert (
        "lookup/0/success: rejected: success below 0.95 of the reward of a correct run"
        in shown.output
    )
    assert "lookup/0/failure" not in shown.output
    kept = runner.invoke(app, ["bank", "explain", str(out), "--task", "lookup/0/failure"])
    assert "lookup/0/failure: kept 6 state(s)" in kept.output
    # Scored all the same: its verdict is its E2E row's demonstration.
    assert "reward 1.000" in kept.output


def test_explain_shows_a_kept_success_with_its_reward(toy_bank):
    result = runner.invoke(app, ["bank", "explain", str(toy_bank.root), "--all"])
    assert result.exit_code == 0, result.output
    assert "threshold/0/success: kept 6 state(s)" in result.output
    assert "reward 1.000" in result.output


def test_explain_of_a_directory_without_a_build_says_how_to_make_one(tmp_path):
    from bat_gym.core.errors import BankError

    result = runner.invoke(app, ["bank", "explain", str(tmp_path)])
    assert isinstance(result.exception, BankError)
    assert "bat-gym bank build" in str(result.exception)


def test_the_default_grid_builds_with_one_command_and_explains_its_rejections(
    bench_named, tmp_path, monkeypatch
):
    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    result = runner.invoke(app, ["bank", "build", "--default", "--benchmark", "toy_pipeline"])
    assert result.exit_code == 0, result.output
    assert "toy_pipeline default grid: 36 states" in result.output
    assert runner.invoke(app, ["bank", "build", "--default", "--out", "x"]).exit_code == 2

    name = bench_named("toy_nosubmit2", drop_submit=True)
    result = runner.invoke(app, ["bank", "build", "--default", "--benchmark", name])
    assert result.exit_code != 0
    assert "success below 0.95 of the reward of a correct run" in str(result.exception)
    shown = runner.invoke(app, ["bank", "explain", "--default", "--benchmark", name])
    assert (
        "threshold/0/success: rejected: success below 0.95 of the reward of a correct run"
        in shown.output
    )
    assert "(1 of 2 trajectories built)" in shown.output
