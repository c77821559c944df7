"""`bat-gym serve mcp` played by the mcp SDK's own client, over stdio and streamable HTTP.

Each test starts the command as a subprocess on a toy bank state and compares what the
client reads with the in-process env (RubricReward around StageEnv) given the same calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.types import Implementation  # noqa: E402

from bat_gym.core.protocol import ToolCall, get_protocol  # noqa: E402
from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.rubrics.verifier.reward import RubricReward  # noqa: E402

from .servers import free_port, wait_for_port  # noqa: E402

BAT_GYM = str(Path(sys.executable).parent / "bat-gym")
HERMES = get_protocol("hermes")
AGENT = Implementation(name="scripted-teacher", version="1.0")


@pytest.fixture(scope="module")
def state_id(toy_bank) -> str:
    return sorted(toy_bank.select(focus="E2E"))[0]


@pytest.fixture(scope="module")
def teacher_calls(toy, toy_bank, state_id, helpers) -> list[ToolCall]:
    """The teacher's calls from the state to its finish, in order."""
    actions = helpers.teacher_actions(toy, toy_bank.get(state_id))
    return [call for action in actions for call in HERMES.parse(action).calls]


def _server_args(toy_bank, state_id, *extra: str) -> list[str]:
    return [
        "serve",
        "mcp",
        "--benchmark",
        "toy_pipeline",
        "--states",
        str(toy_bank.root),
        "--state",
        state_id,
        *extra,
    ]


@asynccontextmanager
async def stdio_session(args: list[str]):
    params = StdioServerParameters(
        command=BAT_GYM, args=args, env={"BAT_GYM_CACHE": os.environ["BAT_GYM_CACHE"]}
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, client_info=AGENT) as session,
    ):
        yield session, await session.initialize()


@asynccontextmanager
async def http_session(args: list[str]):
    port = free_port()
    proc = subprocess.Popen([BAT_GYM, *args, "--http", str(port)])
    try:
        wait_for_port(proc, port, "bat-gym serve mcp --http", timeout_s=20)
        async with (
            streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
            ClientSession(read, write, client_info=AGENT) as session,
        ):
            yield session, await session.initialize()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


SESSIONS = {"stdio": stdio_session, "http": http_session}


def _text(result) -> str:
    return "\n".join(c.text for c in result.content)


def _runs(calls) -> list[tuple]:
    """What each call of an execution record ran and did (its timing left out)."""
    return [(c["language"], c["code"], c["exit_code"], c["output"], c["writes"]) for c in calls]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_teacher_over_mcp_scores_as_in_process(
    transport, toy, toy_bank, state_id, teacher_calls, tmp_path, in_process
) -> None:
    reward, info = in_process(toy, toy_bank, state_id, teacher_calls)
    args = _server_args(toy_bank, state_id, "--out", str(tmp_path))

    async def play():
        async with SESSIONS[transport](args) as (session, init):
            names = {t.name for t in (await session.list_tools()).tools}
            prompt = await session.get_prompt("task")
            results = [await session.call_tool(c.name, c.arguments) for c in teacher_calls]
            return init, names, prompt, results

    init, names, prompt, results = asyncio.run(play())
    assert {"execute_code", "finish"} <= names
    assert state_id in init.instructions
    assert "[system]" in prompt.messages[0].content.text
    assert not any(r.is_error for r in results)
    assert [r.structured_content["ended"] for r in results] == [False] * (len(results) - 1) + [True]
    last = results[-1]
    assert last.structured_content["reward"] == pytest.approx(reward)
    assert last.structured_content["stop_reason"] == "finished"
    assert info["verdict"].summary() in _text(last)
    assert reward > 0
    # The execution record is the in-process one; the client is named beside the trace.
    played = json.loads((tmp_path / "agent.json").read_text())
    assert played["agent"] == {"name": "scripted-teacher", "version": "1.0"}
    assert played["reward"] == pytest.approx(reward)
    trace = json.loads((tmp_path / played["trace"]).read_text())
    expected = info["record"].model_dump(mode="json")
    assert _runs(trace["record"]["calls"]) == _runs(expected["calls"])
    assert trace["record"]["start_digest"] == expected["start_digest"]
    assert trace["verdict"] == info["verdict"].model_dump(mode="json")


def test_budget_end_without_finish_is_scored(
    toy, toy_bank, state_id, teacher_calls, in_process
) -> None:
    calls = [c for c in teacher_calls if c.name != "finish"][:2]
    reward, info = in_process(toy, toy_bank, state_id, calls, max_turns=2)

    async def play():
        async with stdio_session(_server_args(toy_bank, state_id, "--budget", "max_turns=2")) as (
            session,
            _,
        ):
            results = [await session.call_tool(c.name, c.arguments) for c in calls]
            after = await session.call_tool("finish", {"summary": "too late"})
            return results, after

    results, after = asyncio.run(play())
    end = results[-1]
    assert end.structured_content == {"ended": True, "stop_reason": "turn_budget", "reward": reward}
    assert info["verdict"].summary() in _text(end)
    assert after.is_error and "the episode has ended" in _text(after)


def test_bad_argument_is_a_tool_error_and_the_episode_goes_on(toy, toy_bank, state_id) -> None:
    async def play():
        async with stdio_session(_server_args(toy_bank, state_id)) as (session, _):
            bad = await session.call_tool("execute_code", {"language": "cobol", "code": "x"})
            missing = await session.call_tool("execute_code", {"language": "bash"})
            done = await session.call_tool("finish", {"summary": "stopping"})
            return bad, missing, done

    bad, missing, done = asyncio.run(play())
    assert bad.is_error and "[tool call error]" in _text(bad) and "cobol" in _text(bad)
    assert missing.is_error and "code" in _text(missing)
    assert not done.is_error and done.structured_content["stop_reason"] == "finished"
    assert done.structured_content["reward"] is not None


WITHOUT_MCP = """
import sys

class WithoutMcp:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "mcp":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, WithoutMcp())
sys.argv = ["bat-gym", "serve", "mcp", "--state", "any"]
from bat_gym.cli import main

main()
"""


def test_without_the_extra_serve_says_what_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MCP], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "bat-gym serve needs an extra" in line and "[mcp]" in line


def test_a_benchmarks_own_tools_answer_as_in_process(tmp_path) -> None:
    """In-process (the SDK's Client on the server object): lookup_case of tests/tool_bench.py."""
    from mcp import Client
    from tool_bench import ToolBench

    from bat_gym.bank.states import MemoryStates, initial_state
    from bat_gym.core.sandbox.snapshot import BlobStore
    from bat_gym.integrations.mcp_server import McpEpisode, build_server

    bench = ToolBench()
    store = BlobStore(tmp_path / "store")
    states = MemoryStates(store, [initial_state(bench, 5, "threshold", store, "hermes")])
    [state_id] = states.select()
    case = next(iter(bench._rows(bench.task_of_state(states.get(state_id)))))
    calls = [
        ToolCall(name="lookup_case", arguments={"case_id": case}),
        ToolCall(name="lookup_case", arguments={"case_id": "nope"}),
        ToolCall(name="count_files", arguments={"directory": "data"}),
        ToolCall(name="finish", arguments={"summary": "looked"}),
    ]

    def env():
        return RubricReward(StageEnv(benchmark=bench, states=states))

    native = env()
    native.reset(options={"state_id": state_id})
    expected = [native.step(HERMES.render("", [c])) for c in calls]
    native.close()
    episode = McpEpisode(env(), state_id)

    async def play():
        async with Client(build_server(episode)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            return tools, [await client.call_tool(c.name, c.arguments) for c in calls]

    try:
        tools, results = asyncio.run(play())
        late = episode.call("finish", {"summary": "again"})
    finally:
        episode.close()
    assert late.is_error and late.ended and "the episode has ended" in late.text
    schemas = {t.schema()["function"]["name"]: t.schema()["function"] for t in bench.tools()}
    assert tools["lookup_case"].input_schema == schemas["lookup_case"]["parameters"]
    observations = [obs for obs, *_ in expected]
    assert [_text(r) for r in results[:3]] == observations[:3]
    assert [r.is_error for r in results] == [False, True, False, False]
    assert results[-1].structured_content["reward"] == pytest.approx(expected[-1][1])
