"""Benchmark-defined tools through the env: schemas, protocols, limits, record, rubric."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tool_bench import SECRET, ToolBench

from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import Budgets
from bat_gym.core.tools import Tool, ToolContext, run_host_tool
from bat_gym.env import StageEnv
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

HERMES = get_protocol("hermes")


@pytest.fixture(scope="module")
def bench():
    return ToolBench()


@pytest.fixture(scope="module")
def states(bench, tmp_path_factory):
    store = BlobStore(tmp_path_factory.mktemp("tools") / "store")
    return MemoryStates(store, [initial_state(bench, 3, "lookup", store, "hermes")])


def make_env(bench, states, **kwargs):
    env = StageEnv("E2E", benchmark=bench, states=states, **kwargs)
    env.reset(options={"state_id": states.select()[0]})
    return env


@pytest.fixture
def env(bench, states):
    e = make_env(bench, states)
    yield e
    e.close()


def say(name, protocol="hermes", **arguments):
    return get_protocol(protocol).render("", [ToolCall(name=name, arguments=arguments)])


def first_case(bench, env):
    return next(iter(bench._rows(env._tool_context(env.tools["lookup_case"]).task)))


def test_the_schema_comes_from_the_argument_model(env):
    _, info = env.reset(options={"state_id": env.state.state_id})
    names = [t["function"]["name"] for t in info["tools"]]
    assert names[:2] == ["execute_code", "finish"] and "lookup_case" in names
    schema = next(t for t in info["tools"] if t["function"]["name"] == "lookup_case")
    params = schema["function"]["parameters"]
    assert params["required"] == ["case_id"] and params["additionalProperties"] is False
    assert params["properties"]["case_id"]["pattern"] == r"^case\d{3}$"
    # The prompt carries the same schema, for templates that show no tools.
    system = info["messages"][0]["content"]
    assert "lookup_case" in system and json.dumps(params, sort_keys=True) in system


@pytest.mark.parametrize("protocol", ["hermes", "json", "openai"])
def test_a_host_tool_runs_through_every_protocol(bench, states, protocol):
    env = make_env(bench, states, protocol=protocol)
    try:
        case = first_case(bench, env)
        obs, _, terminated, truncated, info = env.step(say("lookup_case", protocol, case_id=case))
        assert not (terminated or truncated)
        assert obs.startswith("[lookup_case: ok]\n") and f'"id": "{case}"' in obs
        (use,) = info["record"].tool_uses
        assert (use.name, use.arguments, use.status, use.index, use.turn) == (
            "lookup_case",
            {"case_id": case},
            "ok",
            0,
            0,
        )
        assert use.result_sha256 == hashlib.sha256(use.output.encode()).hexdigest()
        assert info["tool_calls"] == 1 and info["messages"][-1]["name"] == "lookup_case"
    finally:
        env.close()


def test_a_sandbox_tool_runs_as_a_program_and_is_recorded_twice(env):
    obs, *_, info = env.step(say("count_files", directory="data"))
    assert obs.startswith("[exit code 0") and "1 files" in obs
    (run,) = info["record"].calls
    (use,) = info["record"].tool_uses
    assert run.tool == "count_files" and use.call == run.index == use.index == 0
    assert use.status == "ok" and "1 files" in use.output


def test_builtin_and_benchmark_calls_share_one_index(env):
    *_, info = env.step(say("execute_code", language="bash", code="true"))
    *_, info = env.step(say("lookup_case", case_id="case000"))  # not the task's: an error
    *_, info = env.step(say("execute_code", language="bash", code="true"))
    record = info["record"]
    assert [c.index for c in record.calls] == [0, 2]
    assert [(u.index, u.status) for u in record.tool_uses] == [(1, "error")]


def test_a_benchmark_tools_bad_arguments_are_a_structured_error(env):
    *_, info = env.step(say("lookup_case", case_id="../etc"))
    (error,) = info["tool_errors"]
    assert (error["call"], error["tool"], error["kind"]) == (0, "lookup_case", "invalid_arguments")
    assert error["message"].startswith("lookup_case: invalid arguments (case_id:")


def test_bad_arguments_are_a_tool_call_error_that_names_the_field(env):
    obs, _, terminated, truncated, info = env.step(say("lookup_case", case_id="../etc"))
    assert obs.startswith("[tool call error] lookup_case: invalid arguments (case_id:")
    assert not (terminated or truncated) and info["tool_calls"] == 0
    obs, *_ = env.step(say("lookup_case", case="case001"))
    assert "case_id: Field required" in obs and "case: Extra inputs" in obs
    obs, *_ = env.step(say("no_such_tool"))
    assert "unknown tool 'no_such_tool'" in obs and "lookup_case" in obs


def test_a_tool_error_is_shown_and_a_crash_hides_its_text(env, caplog):
    obs, *_ = env.step(say("lookup_case", case_id="case000"))
    assert obs.startswith("[lookup_case: error]\n") and "no case case000" in obs
    with caplog.at_level(logging.ERROR, logger="bat_gym.core.tools"):
        obs, _, terminated, truncated, info = env.step(say("boom"))
    assert "internal error (RuntimeError)" in obs and SECRET not in obs
    assert SECRET not in json.dumps(info["messages"])
    assert SECRET not in info["record"].tool_uses[-1].output
    # The handler ran in a child process: its traceback reaches the host's log.
    assert any(
        SECRET in r.getMessage() and "RuntimeError" in r.getMessage() for r in caplog.records
    )
    assert info["record"].tool_uses[-1].status == "crashed" and not (terminated or truncated)


def test_a_slow_handler_times_out_and_the_episode_goes_on(bench, states):
    env = make_env(bench, states, budgets=Budgets(tool_timeout_s=0.3))
    try:
        t0 = time.monotonic()
        obs, _, terminated, truncated, info = env.step(say("slow", seconds=10))
        # The step returns at the timeout, not when the handler wakes (the margin is
        # for a loaded machine: the step also scans the workspace).
        assert time.monotonic() - t0 < 7.0
        assert obs.startswith("[slow: timed out at the ") and not (terminated or truncated)
        assert info["record"].tool_uses[-1].status == "timed_out"
        obs, *_ = env.step(say("slow", seconds=0))
        assert obs.startswith("[slow: ok]")
    finally:
        env.close()


def test_output_is_clipped_like_execute_code_and_recorded_in_full_digest(env):
    obs, *_, info = env.step(say("chatty", size=300_000))
    assert len(obs) <= env.budgets.max_observation_chars and "characters cut" in obs
    use = info["record"].tool_uses[-1]
    assert use.output_chars == 300_000 and len(use.output) <= 65536
    assert use.result_sha256 == hashlib.sha256(b"x" * 300_000).hexdigest()


def test_benchmark_tools_spend_the_tool_call_budget(bench, states):
    env = make_env(bench, states, budgets=Budgets(max_tool_calls=1))
    try:
        action = HERMES.render(
            "",
            [
                ToolCall(name="chatty", arguments={"size": 1}),
                ToolCall(name="count_files", arguments={}),
            ],
        )
        obs, _, _, truncated, info = env.step(action)
        assert truncated and "the tool-call budget is spent" in obs
        assert [u.name for u in info["record"].tool_uses] == ["chatty"]
    finally:
        env.close()


def test_private_answers_only_for_a_tool_that_declares_them(bench, env):
    obs, *_, info = env.step(say("peek"))
    assert "internal error (PrivateAnswersWithheld)" in obs
    assert info["record"].tool_uses[-1].status == "crashed"
    task = env._task
    case, score = next(iter(bench.private_answers(task)["scores"].items()))
    obs, *_ = env.step(say("grade", case_id=case, score=score))
    assert obs.endswith("\nagrees")
    assert str(score) not in obs


def _ctx(record, answers=None):
    oracle = None if answers is None else TaskOracle(lambda: answers, lambda ws: None)
    ws = FrozenWorkspace.__new__(FrozenWorkspace)  # the check reads only the record
    return CheckContext(workspace=ws, start=ws, record=record, task=oracle, spec=None)


def test_the_tool_called_check_rests_on_the_record(bench, env):
    case = first_case(bench, env)
    env.step(say("lookup_case", case_id="case000"))
    *_, info = env.step(say("lookup_case", case_id=case))
    record = info["record"]
    ok = run_check("tool_called", _ctx(record), {"name": "lookup_case"})
    assert ok.passed is True and [e.call for e in ok.evidence] == [1]
    wrong = run_check(
        "tool_called",
        _ctx(record),
        {"name": "lookup_case", "arguments": {"case_id": {"equals": "case999"}}},
    )
    assert wrong.passed is False
    answer = run_check(
        "tool_called",
        _ctx(record, {"first": case}),
        {"name": "lookup_case", "arguments": {"case_id": {"equals_answer": "first"}}},
    )
    assert answer.passed is True and case not in answer.detail
    assert run_check(
        "tool_called", _ctx(record), {"name": "lookup_case", "status": "any", "min_calls": 2}
    ).passed
    assert (
        run_check("tool_called", _ctx(record), {"name": "lookup_case", "min_calls": 2}).passed
        is False
    )
    null = run_check(
        "tool_called",
        _ctx(record),
        {"name": "lookup_case", "arguments": {"case_id": {"equals_answer": "first"}}},
    )
    assert null.passed is None
    never = run_check("tool_called", _ctx(record), {"name": "grade"})
    assert never.passed is False and "never called" in never.detail


def test_tool_declarations_are_checked(bench, states):
    class Args(BaseModel):
        x: int

    with pytest.raises(ConfigError, match="built in"):
        Tool("finish", "no", Args, lambda a, c: "")
    with pytest.raises(ConfigError, match="must be 1-64"):
        Tool("bad name", "no", Args, lambda a, c: "")
    with pytest.raises(ConfigError, match="pydantic model"):
        Tool("ok", "no", dict, lambda a, c: "")  # type: ignore[arg-type]

    class Twice(ToolBench):
        def tools(self):
            return (*super().tools(), Tool("boom", "again", Args, lambda a, c: ""))

    with pytest.raises(ConfigError, match="two benchmark tools"):
        StageEnv("E2E", benchmark=Twice(), states=states)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(["lookup_case", "count_files", "slow", "boom", "chatty", "peek", "grade"]),
    arguments=st.dictionaries(
        st.sampled_from(["case_id", "directory", "seconds", "size", "score", "x", ""]),
        _json,
        max_size=4,
    ),
    protocol=st.sampled_from(["hermes", "json", "openai"]),
)
def test_hostile_arguments_never_make_step_raise(bench, states, name, arguments, protocol):
    if name == "slow" and isinstance(arguments.get("seconds"), (int, float)):
        arguments["seconds"] = (
            min(abs(arguments["seconds"]), 0.01)
            if arguments["seconds"] == arguments["seconds"]
            else 0
        )
    env = _shared_env(bench, states, protocol)
    if (
        env._done
        or env.tool_calls >= env.budgets.max_tool_calls - 1
        or env.turns >= env.budgets.max_turns - 1
    ):
        env.reset(options={"state_id": states.select()[0]})
    try:
        text = get_protocol(protocol).render("", [ToolCall(name=name, arguments=arguments)])
    except (TypeError, ValueError):  # not JSON-writable (NaN keys...): nothing to send
        return
    obs, reward, _, _, info = env.step(text)
    assert isinstance(obs, str) and reward == 0.0
    assert len(obs) <= max(env.budgets.max_observation_chars, 2000)


_ENVS: dict[str, StageEnv] = {}


def _shared_env(bench, states, protocol):
    # One env per protocol for all examples: a reset restores the state exactly.
    if protocol not in _ENVS:
        _ENVS[protocol] = make_env(bench, states, protocol=protocol)
    return _ENVS[protocol]


@pytest.fixture(scope="module", autouse=True)
def _close_shared():
    yield
    for env in _ENVS.values():
        env.close()
    _ENVS.clear()


def test_a_sandbox_tool_that_builds_no_program_is_not_run(states):
    class Args(BaseModel):
        pass

    class Broken(ToolBench):
        def tools(self):
            return (
                Tool(
                    "broken", "returns no program", Args, lambda a, c: "rm -rf /", runs_in="sandbox"
                ),
            )

    env = make_env(Broken(), states)
    try:
        obs, _, terminated, truncated, info = env.step(say("broken"))
        assert obs == "[broken: not run: the tool failed with an internal error]"
        assert not (terminated or truncated) and info["record"].calls == []
        (use,) = info["record"].tool_uses
        assert (use.status, use.call, info["tool_calls"]) == ("not_run", None, 1)
    finally:
        env.close()


# -- host handlers run in a worker process that a timeout kills -------------------------


class PathArgs(BaseModel):
    model_config = {"extra": "forbid"}
    path: str


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet collected, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def hang(args: PathArgs, ctx: ToolContext) -> str:
    """Start a grandchild, ignore SIGTERM, and never return."""
    child = subprocess.Popen(["sleep", "1000"])
    Path(args.path).write_text(f"{os.getpid()} {child.pid}")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def die(args: PathArgs, ctx: ToolContext) -> str:
    os._exit(3)


def touch_memory(args: PathArgs, ctx: ToolContext) -> str:
    """Changes the env's objects; in a worker process that changes nothing of the env's."""
    ctx.task.params["touched"] = True
    return "touched"


class HostileBench(ToolBench):
    """The tool benchmark plus handlers that hang, die, or touch the env's memory."""

    def tools(self):
        return (
            *super().tools(),
            Tool("hang", "Never return.", PathArgs, hang),
            Tool("die", "Exit the worker.", PathArgs, die),
            Tool("touch_memory", "Change the task object.", PathArgs, touch_memory),
        )


def test_a_handler_that_hangs_is_killed_with_what_it_started_and_the_env_goes_on(states, tmp_path):
    env = make_env(HostileBench(), states, budgets=Budgets(tool_timeout_s=0.5))
    pids = tmp_path / "pids"
    try:
        t0 = time.monotonic()
        obs, _, terminated, truncated, info = env.step(say("hang", path=str(pids)))
        assert time.monotonic() - t0 < 5.0  # 0.5 s, and a loaded machine's slack
        assert obs.startswith("[hang: timed out at the ") and not (terminated or truncated)
        use = info["record"].tool_uses[-1]
        assert (use.status, use.output, use.arguments) == ("timed_out", "", {"path": str(pids)})
        worker, grandchild = (int(p) for p in pids.read_text().split())
        assert worker != os.getpid()
        deadline = time.monotonic() + 5
        while (_alive(worker) or _alive(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(worker) and not _alive(grandchild)
        # The very next call, right after the kill, runs as ever.
        case = first_case(HostileBench(), env)
        obs, *_, info = env.step(say("lookup_case", case_id=case))
        assert obs.startswith("[lookup_case: ok]\n")
        obs, *_, info = env.step(say("execute_code", language="bash", code="echo fine"))
        assert "fine" in obs and info["record"].calls[-1].succeeded
    finally:
        env.close()


def test_a_worker_that_dies_is_a_crash_and_a_handler_cannot_touch_the_env(states, tmp_path):
    env = make_env(HostileBench(), states)
    try:
        obs, _, terminated, truncated, info = env.step(say("die", path="x"))
        assert "internal error (WorkerDied)" in obs and not (terminated or truncated)
        assert info["record"].tool_uses[-1].status == "crashed"
        obs, *_ = env.step(say("touch_memory", path="x"))
        assert obs.endswith("\ntouched") and "touched" not in env._task.params
    finally:
        env.close()


def test_a_huge_result_comes_back_capped_with_its_whole_length_and_digest(env):
    size = 2_000_000
    t0 = time.monotonic()
    obs, *_, info = env.step(say("chatty", size=size))
    assert time.monotonic() - t0 < 10.0
    use = info["record"].tool_uses[-1]
    assert use.status == "ok" and use.output_chars == size and len(use.output) == 65536
    assert use.result_sha256 == hashlib.sha256(b"x" * size).hexdigest()
    assert len(obs) <= env.budgets.max_observation_chars
    assert f"the result has {size} characters" in obs


def test_run_host_tool_never_raises_and_a_thread_service_keeps_its_changes():
    class InProcess:
        IN_PROCESS = True

        def __init__(self):
            self.calls = 0

    def count(args, ctx):
        ctx.service.calls += 1
        return {"calls": ctx.service.calls}

    service = InProcess()
    tool = Tool("count", "Count.", PathArgs, count)
    out = run_host_tool(tool, PathArgs(path="x"), ToolContext("count", None, service, 5.0))
    assert (out.status, out.text, service.calls) == ("ok", '{"calls": 1}', 1)

    class Remote:
        def __init__(self):
            self.heard = 0

        def after_tool_call(self):
            self.heard += 1

    remote = Remote()
    for handler, status in ((count, "crashed"), (die, "crashed"), (touch_memory, "crashed")):
        tool = Tool("t", "t.", PathArgs, handler)
        out = run_host_tool(tool, PathArgs(path="x"), ToolContext("t", None, remote, 5.0))
        assert out.status == status and out.chars == len(out.text)
    # The worker's failures all reached the service's hook, in this process.
    assert remote.heard == 3


def test_a_timeout_in_one_env_does_not_stall_another_thread(states, tmp_path):
    """Two envs step at once from two threads; the hung one costs only its own timeout."""
    hostile = make_env(HostileBench(), states, budgets=Budgets(tool_timeout_s=5.0))
    calm = make_env(HostileBench(), states)
    try:
        done = {}

        def run_hang():
            done["hang"] = hostile.step(say("hang", path=str(tmp_path / "p")))[0]

        t = threading.Thread(target=run_hang)
        t.start()
        obs, *_ = calm.step(say("chatty", size=10))
        # The calm env's call ended while the other's hung call still waits on its timeout.
        assert obs.startswith("[chatty: ok]") and t.is_alive()
        t.join(10)
        assert done["hang"].startswith("[hang: timed out at the ")
    finally:
        hostile.close()
        calm.close()


_ORPHAN = """
import os, sys, time
from pydantic import BaseModel
from bat_gym.core.tools import Tool, ToolContext, run_host_tool

class A(BaseModel):
    pass

def hang(args, ctx):
    open(sys.argv[1], "w").write(str(os.getpid()))
    while True:
        time.sleep(1)

run_host_tool(Tool("hang", "h", A, hang), A(), ToolContext("hang", None, None, 120.0))
"""


def test_a_worker_dies_with_the_process_that_forked_it(tmp_path):
    pid_file = tmp_path / "worker"
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, str(pid_file)])
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        assert _alive(worker)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)
