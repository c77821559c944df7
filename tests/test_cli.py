import pytest
from typer.testing import CliRunner

from bat_gym.cli import app

runner = CliRunner()


def test_envs_lists_ids_and_benchmarks():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0
    assert "bat/Validate-v0" in result.output
    assert "medbench_lite 1.0 (default)" in result.output and "toy_pipeline 1.0" in result.output


def test_demo_runs_the_teacher_end_to_end(monkeypatch):
    monkeypatch.setenv("BAT_GYM_BENCHMARK", "toy_pipeline")
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert "terminated=True truncated=False reward=1.0" in result.output and "ok=5" in result.output


@pytest.mark.slow
def test_demo_on_the_default_benchmark():
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert "terminated=True truncated=False" in result.output


def test_bank_build_then_show(tmp_path):
    out = tmp_path / "bank"
    result = runner.invoke(app, ["bank", "build", "--out", str(out), "--benchmark", "toy_pipeline"])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["bank", "show", str(out)])
    assert "12 states of toy_pipeline" in shown.output and "S3   lookup" in shown.output
