"""Inspect AI, native: bat_gym tasks run by Inspect's own eval, scored as in-process.

The model is Inspect's ``mockllm`` provider replaying fixed assistant messages (its
real model API), or, for the command line, Inspect's ``openai-api`` provider talking
to a replay server on 127.0.0.1. Every token count is given, so no tokenizer file is
needed offline.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="the inspect extra is not installed")

from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.log import read_eval_log  # noqa: E402
from inspect_ai.model import ChatMessageAssistant, ModelOutput, ModelUsage, get_model  # noqa: E402
from inspect_ai.tool import ToolCall as InspectToolCall  # noqa: E402

from bat_gym.core.protocol import ToolCall, get_protocol  # noqa: E402
from bat_gym.integrations.inspect import StageSandbox, StageSandboxConfig, heldout, stage  # noqa: E402
from bat_gym.rollout import run_episode  # noqa: E402
from bat_gym.rubrics.verifier.reward import make_env  # noqa: E402
from bat_gym.viewer.export import score_explanation  # noqa: E402

from .conftest import teacher_actions  # noqa: E402

HERMES = get_protocol("hermes")
USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


def _reply(content: str, calls: list[ToolCall], turn: int) -> ModelOutput:
    message = ChatMessageAssistant(
        content=content,
        tool_calls=[
            InspectToolCall(id=f"t{turn}_{i}", function=c.name, arguments=c.arguments)
            for i, c in enumerate(calls)
        ]
        or None,
        model="mockllm/model",
    )
    output = ModelOutput.from_message(message)
    output.usage = USAGE  # mockllm would count tokens with a tokenizer file otherwise
    return output


def _replies(actions: list[str]) -> list[ModelOutput]:
    """Hermes-written turns as native tool-call replies (prose stays prose)."""
    out = []
    for turn, action in enumerate(actions):
        parsed = HERMES.parse(action)
        out.append(_reply(parsed.content if parsed.calls else action, parsed.calls, turn))
    return out


def _run(task, replies, **options):
    model = get_model("mockllm/model", custom_outputs=replies)
    (log,) = inspect_eval(
        task, model=model, display="none", log_dir=options.pop("log_dir"), **options
    )
    return log


def _in_process(bank: Path, focus: str, state_id: str, actions: list[str]):
    env = make_env(focus, benchmark="toy_pipeline", states=str(bank))
    try:
        it = iter(actions)
        end = run_episode(env, lambda info: next(it, None), state_id=state_id)
        return end.info
    finally:
        env.close()


@pytest.fixture(scope="module")
def validate_task(toy_bank):
    return stage(benchmark="toy_pipeline", stage="validate", bank=str(toy_bank.root))


def test_a_sample_per_bank_state_in_the_projects_sandbox(toy_bank, validate_task):
    ids = toy_bank.select(focus="S3")
    assert [s.id for s in validate_task.dataset] == ids
    sample = validate_task.dataset[0]
    assert sample.metadata["state_id"] == ids[0] and sample.metadata["focus"] == "S3"
    assert [m.role for m in sample.input][:2] == ["system", "user"]  # the state's own prompt
    assert validate_task.sandbox.type == "bat_gym"
    assert validate_task.sandbox.config == StageSandboxConfig(
        benchmark="toy_pipeline", stage="S3", bank=str(toy_bank.root)
    )


def test_the_teachers_turns_score_as_they_do_in_process(toy, toy_bank, validate_task, tmp_path):
    state_id = validate_task.dataset[0].id
    actions = teacher_actions(toy, toy_bank.get(state_id))
    log = _run(validate_task, _replies(actions), sample_id=state_id, log_dir=str(tmp_path))
    assert log.status == "success", log.error
    (sample,) = log.samples
    score = sample.scores["rubric_scorer"]
    info = _in_process(toy_bank.root, "S3", state_id, actions)
    verdict = info["verdict"]
    assert score.value == verdict.reward == 1.0
    assert score.explanation == score_explanation(verdict)
    assert score.metadata["stages"] == {s.stage: s.credit for s in verdict.stages}
    assert score.metadata["stop_reason"] == "finished"
    # Each tool result the model read is the env's observation for that call.
    tool_texts = [m.text for m in sample.messages[len(sample.input) :] if m.role == "tool"]
    env_texts = [m["content"] for m in info["messages"] if m["role"] == "tool"]
    assert tool_texts[:-1] == env_texts[-len(tool_texts) : -1]
    assert tool_texts[-1].startswith("Finished.") and "reward 1.000" in tool_texts[-1]


def test_prose_is_a_refused_turn_and_a_failed_item_is_explained(validate_task, tmp_path):
    state_id = validate_task.dataset[0].id
    finish = ToolCall(name="finish", arguments={"summary": "stopping"})
    replies = [_reply("I think it is fine.", [], 0), _reply("Done.", [finish], 1)]
    log = _run(validate_task, replies, sample_id=state_id, log_dir=str(tmp_path))
    (sample,) = log.samples
    refusal = sample.messages[len(sample.input) + 1]
    assert refusal.role == "user" and refusal.text.startswith("[tool call error]")
    score = sample.scores["rubric_scorer"]
    assert score.value < 1 and score.metadata["turns"] == 2
    assert " | FAIL S3 " in score.explanation  # which items failed, and why


def test_an_episode_inspect_stops_first_is_scored_as_it_stands(validate_task, tmp_path):
    state_id = validate_task.dataset[0].id
    code = ToolCall(name="execute_code", arguments={"language": "bash", "code": "ls\n"})
    replies = [_reply("", [code], t) for t in range(20)]
    prompt = len(validate_task.dataset[0].input)
    log = _run(
        validate_task, replies, sample_id=state_id, message_limit=prompt + 4, log_dir=str(tmp_path)
    )
    (sample,) = log.samples
    score = sample.scores["rubric_scorer"]
    assert score.metadata["stop_reason"] == "inspect_limit" and score.metadata["tool_calls"] == 2
    assert score.explanation.startswith("S3 reward")


def test_sandbox_exec_is_one_recorded_step_and_writes_are_refused(toy_bank):
    state_id = toy_bank.select(focus="S3")[0]
    config = StageSandboxConfig(benchmark="toy_pipeline", stage="S3", bank=str(toy_bank.root))

    async def play():
        envs = await StageSandbox.sample_init("t", config, {"state_id": state_id})
        box = envs["default"]
        try:
            result = await box.exec(["bash", "-c", "echo hello > note.txt; cat note.txt"])
            assert result.success and result.stdout.strip().endswith("hello")
            record = box.episode.info["record"]
            assert [c.code for c in record.calls] == [
                "bash -c 'echo hello > note.txt; cat note.txt'"
            ]
            assert box.episode.info["turns"] == 1
            assert (await box.read_file("note.txt")).strip() == "hello"
            assert (await box.read_file("/workspace/note.txt")).strip() == "hello"
            with pytest.raises(PermissionError, match="execute_code"):
                await box.write_file("forged.txt", "x")
            with pytest.raises(PermissionError, match="outside"):
                await box.read_file("/etc/passwd")
        finally:
            await StageSandbox.sample_cleanup("t", config, envs, False)

    asyncio.run(play())


def test_a_held_out_runs_log_carries_aggregates_only(tmp_path):
    task = heldout(benchmark="toy_pipeline", repeats=1)
    seeds = {str(s.metadata["state_id"]).split(".")[0] for s in task.dataset}
    finish = ToolCall(name="finish", arguments={"summary": "stopping"})
    replies = [_reply("Done.", [finish], t) for t in range(len(task.dataset))]

    refused = _run(task, list(replies), log_dir=str(tmp_path / "a"))
    assert refused.status == "error" and "--no-log-samples" in refused.error.message
    assert not refused.samples

    log = _run(task, replies, log_samples=False, log_dir=str(tmp_path / "b"))
    assert log.status == "success" and not log.samples
    metrics = log.results.scores[0].metrics
    assert metrics["mean"].value == 0.0 and metrics["overall"].value == 0.0
    text = read_eval_log(log.location).model_dump_json()
    # No task (its held-out seed names it), prompt or verdict line is in the log.
    assert not any(seed in text for seed in seeds)
    assert "cases.csv" not in text and "reward 0.000" not in text


def test_a_benchmarks_own_tools_are_inspect_tools_stepping_the_env(tmp_path):
    from inspect_ai import Task
    from inspect_ai.dataset import Sample
    from inspect_ai.util import SandboxEnvironmentSpec
    from tool_bench import ToolBench

    from bat_gym.bank.states import MemoryStates, initial_state
    from bat_gym.catalog import register_benchmark, unregister_benchmark
    from bat_gym.core.sandbox.snapshot import BlobStore
    from bat_gym.integrations.inspect import play_stage, rubric_scorer
    from bat_gym.integrations.inspect.sandbox import register_states
    from bat_gym.integrations.inspect.tasks import chat_messages

    bench = ToolBench()
    store = BlobStore(tmp_path / "store")
    state = initial_state(bench, 5, "threshold", store, "hermes")
    states = MemoryStates(store, [state])
    actions = teacher_actions(bench, state)
    # The teacher calls the benchmark's own tool in its first turn.
    assert "lookup_case" in [c.name for c in HERMES.parse(actions[0]).calls]
    register_benchmark("toy_tools", bench)
    try:
        config = StageSandboxConfig(
            benchmark="toy_tools", stage="E2E", states_token=register_states(states)
        )
        task = Task(
            dataset=[
                Sample(
                    id="s",
                    input=chat_messages(state.messages),
                    metadata={"state_id": state.state_id},
                )
            ],
            solver=play_stage(),
            scorer=rubric_scorer(),
            sandbox=SandboxEnvironmentSpec("bat_gym", config),
        )
        log = _run(task, _replies(actions), log_dir=str(tmp_path / "logs"))
        env = make_env("E2E", benchmark=bench, states=states)
        it = iter(actions)
        native = run_episode(env, lambda info: next(it, None), state_id=state.state_id).info
        env.close()
    finally:
        unregister_benchmark("toy_tools")
    (sample,) = log.samples
    (lookup,) = [m for m in sample.messages if m.role == "tool" and m.function == "lookup_case"]
    (native_lookup,) = [m for m in native["messages"] if m.get("name") == "lookup_case"]
    assert lookup.text == native_lookup["content"]
    assert sample.scores["rubric_scorer"].value == native["verdict"].reward >= 0.9


class _Replay(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint replaying fixed assistant messages, with usage."""

    replies: list[dict] = []

    def do_POST(self):  # noqa: N802 - the http.server hook's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        message = self.replies[min(turn - self.server.prefix_turns, len(self.replies) - 1)]
        data = json.dumps(
            {
                "id": f"r{turn}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_inspect_eval_runs_the_entry_points_task_from_the_command_line(toy, toy_bank, tmp_path):
    state_id = toy_bank.select(focus="S3")[0]
    state = toy_bank.get(state_id)
    replies = []
    for turn, action in enumerate(teacher_actions(toy, state)):
        calls = HERMES.parse(action).calls
        replies.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{turn}_{i}",
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for i, c in enumerate(calls)
                ],
            }
        )
    handler = type("Replay", (_Replay,), {"replies": replies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.prefix_turns = sum(1 for m in state.messages if m["role"] == "assistant")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "LOCAL_API_KEY": "unused",
        "LOCAL_BASE_URL": f"http://127.0.0.1:{server.server_port}/v1",
    }
    inspect = Path(sys.executable).with_name("inspect")
    try:
        done = subprocess.run(
            [str(inspect), "eval", "bat_gym/stage", "-T", "benchmark=toy_pipeline",
             "-T", "stage=validate", "-T", f"bank={toy_bank.root}", "--sample-id", state_id,
             "--model", "openai-api/local/teacher", "--log-dir", str(tmp_path),
             "--display", "none"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("*.eval")
    log = read_eval_log(str(path))
    assert log.status == "success" and log.eval.task == "bat_gym/stage/toy_pipeline/S3"
    score = log.samples[0].scores["rubric_scorer"]
    assert score.value == 1.0 and score.explanation.startswith("S3 reward 1.000")


@pytest.mark.parametrize("policy", ["teacher", "naive"])
def test_a_served_policy_scores_in_inspect_as_in_bat_gym_eval(policy, tmp_path):
    """Held-out cells through `bat-gym serve-policy`: each cell's numbers equal `bat-gym eval`'s."""
    from bat_gym.evaluation import EvalConfig, evaluate
    from bat_gym.integrations.policy_server import serve_policy
    from bat_gym.policies import make_policy

    cfg = EvalConfig(repeats=1, workers=1, progress=False)
    with make_policy(policy) as agent:
        report = evaluate("toy_pipeline", agent, tmp_path / "eval", cfg)
    with serve_policy(policy, benchmark="toy_pipeline") as url:
        model = get_model(f"openai-api/local/{policy}", base_url=url, api_key="unused")
        task = heldout(benchmark="toy_pipeline", repeats=1, name_state=True)
        (log,) = inspect_eval(
            task, model=model, log_samples=False, display="none", log_dir=str(tmp_path / "log")
        )
    assert log.status == "success", log.error
    scored = {s.sample_id: s for r in log.reductions for s in r.samples}
    expected = {f"{c.cell.track}-r{c.cell.repeat}": c for c in report.cells}
    assert scored.keys() == expected.keys()
    for key, cell in expected.items():
        got = scored[key]
        assert (got.value, got.metadata["overall"], got.metadata["task"]) == (
            cell.reward,
            cell.overall,
            cell.task,
        )
        assert got.metadata["stages"] == cell.stages
    assert log.results.scores[0].metrics["overall"].value == pytest.approx(
        report.aggregates.overall
    )
