import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.core.errors import EnvNotFound

runner = CliRunner()


def test_envs_lists_ids_and_benchmarks():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0
    assert "bat/Validate-v0" in result.output
    assert "medbench_lite 2.2 (default)" in result.output and "toy_pipeline 2.0" in result.output


def test_demo_runs_the_teacher_end_to_end(monkeypatch):
    monkeypatch.setenv("BAT_GYM_BENCHMARK", "toy_pipeline")
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert "finished after 5 tool calls (5 exited 0)" in result.output
    assert (
        "reward 1.000 = 0.5 x task score 1.000 + 0.5 x weighted stage credit 1.000" in result.output
    )


def test_demo_in_a_stage_env_plays_that_stage_only(monkeypatch):
    monkeypatch.setenv("BAT_GYM_BENCHMARK", "toy_pipeline")
    result = runner.invoke(app, ["demo", "--env", "bat/Plan-v0"])
    assert result.exit_code == 0, result.output
    assert "finished after 1 tool calls (1 exited 0)" in result.output
    assert "stage credit S1 1.00" in result.output
    assert "reward 1.000 (the stage's credit" in result.output


def test_demo_with_a_mistyped_env_id_says_so_in_one_line():
    result = runner.invoke(app, ["demo", "--env", "bat/Validat-v0"])
    assert result.exit_code != 0
    assert isinstance(result.exception, EnvNotFound)
    assert "Did you mean 'bat/Validate-v0'" in str(result.exception)


def test_demo_seeds_walk_the_success_states_in_order(monkeypatch):
    monkeypatch.setenv("BAT_GYM_BENCHMARK", "toy_pipeline")
    played = []
    for seed in range(4):
        result = runner.invoke(app, ["demo", "--seed", str(seed), "--quiet"])
        assert result.exit_code == 0, result.output
        played.append(result.output.split(": state ", 1)[1].split()[0])
    # toy_pipeline's grid holds two E2E success states (two tracks): seeds 0 and 1
    # play both, and the walk wraps.
    assert all(p.endswith(".E2E.success") for p in played)
    assert played[0] != played[1] and played[2:] == played[:2]


@pytest.mark.slow
def test_demo_on_the_default_benchmark():
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert ".E2E.success (track" in result.output
    assert "finished after" in result.output and "reward 1.000" in result.output


def test_bank_build_then_show(tmp_path):
    out = tmp_path / "bank"
    result = runner.invoke(app, ["bank", "build", "--out", str(out), "--benchmark", "toy_pipeline"])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["bank", "show", str(out)])
    assert "12 states of toy_pipeline" in shown.output and "S3   lookup" in shown.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bank", "show", "README.md"], "a file, not a Stage Bank directory"),
        (["eval", "--policy", "hf:/no/such/model", "--out", "{tmp}/run"], "no model directory"),
        (["eval", "--policy", "openai:http://127.0.0.1:9/v1#m", "--out", "{tmp}/run",
          "--benchmark", "toy_pipeline"], "no server answers"),
    ],
)  # fmt: skip
def test_user_mistakes_are_one_line(args, says, tmp_path):
    """Run as the console script runs it: an error a user caused is one line, no traceback."""
    import subprocess
    import sys

    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run(
        [sys.executable, "-c", "from bat_gym.cli import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
