"""`bat-gym serve openenv` played by OpenEnv's own typed client, and the routes built on it.

The server is the command itself, started on a free port of 127.0.0.1 over a toy bank;
every episode is compared with the in-process env (RubricReward around StageEnv) given
the same calls, one per step.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip(
    "openenv", reason="the openenv extra has a venv of its own: .ci/venv-openenv.sh"
)

from bat_gym.core.protocol import ToolCall, get_protocol  # noqa: E402
from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.integrations.openenv import BatAction, BatObservation, BatOpenEnv  # noqa: E402
from bat_gym.integrations.openenv_client import BatEnvClient  # noqa: E402
from bat_gym.integrations.trl_tools import BatToolEnvironments  # noqa: E402
from bat_gym.policies import EpisodeContext, PolicyRequest, ScriptedPolicy  # noqa: E402
from bat_gym.rubrics.verifier.reward import RubricReward  # noqa: E402

from .servers import free_port  # noqa: E402

BAT_GYM = str(Path(sys.executable).parent / "bat-gym")
HERMES = get_protocol("hermes")
EXACT = 1e-9


def scripted_calls(bench, state, script: str) -> list[ToolCall]:
    """The scripted policy's calls from ``state`` to its ``finish``, in order."""
    policy = ScriptedPolicy(script, protocol="hermes")
    calls: list[ToolCall] = []
    for turn in range(64):
        text = policy.act(PolicyRequest([], [], EpisodeContext(bench, state, turn))).text
        calls += HERMES.parse(text).calls
        if any(c.name == "finish" for c in calls):
            return calls
    raise AssertionError(f"the {script} never finishes")


def assert_scored_as(final: BatObservation, reward: float, verdict) -> None:
    assert final.done and final.error is None
    assert final.reward == pytest.approx(reward, abs=EXACT)
    assert final.verdict == verdict.summary()
    want = {s.stage: s.credit for s in verdict.stages}
    assert final.stage_scores.keys() == want.keys() and want
    for stage, credit in want.items():
        assert final.stage_scores[stage] == pytest.approx(credit, abs=EXACT)
    assert final.stage_score == pytest.approx(verdict.stage_score, abs=EXACT)


@pytest.fixture(scope="module")
def e2e_state(toy_bank) -> str:
    return sorted(toy_bank.select(focus="E2E"))[0]


@pytest.fixture(scope="module")
def stage_state(toy_bank) -> str:
    return sorted(toy_bank.select(focus="S1"))[0]


@pytest.fixture(scope="module")
def server(toy_bank):
    """``bat-gym serve openenv`` on a free port; its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [BAT_GYM, "serve", "openenv", "--benchmark", "toy_pipeline"]
        + ["--states", str(toy_bank.root), "--port", str(port), "--max-sessions", "4"],
        env={**os.environ},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:  # until OpenEnv's /health answers
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("bat-gym serve openenv did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("script", ["teacher", "naive"])
def test_client_scores_as_in_process(script, toy, toy_bank, e2e_state, server, in_process) -> None:
    calls = scripted_calls(toy, toy_bank.get(e2e_state), script)
    reward, info = in_process(toy, toy_bank, e2e_state, calls)
    with BatEnvClient(base_url=server).sync() as env:
        first = env.reset(state_id=e2e_state)
        assert not first.done and first.observation.state_id == e2e_state
        assert {t["function"]["name"] for t in first.observation.tools} >= {
            "execute_code",
            "finish",
        }
        results = [env.step(BatAction(tool=c.name, arguments=c.arguments)) for c in calls]
        state = env.state()
    assert [r.done for r in results] == [False] * (len(calls) - 1) + [True]
    final = results[-1].observation
    assert_scored_as(final, reward, info["verdict"])
    assert final.metadata["terminated"] is True and final.metadata["truncated"] is False
    assert final.stop_reason == info["stop_reason"] == "finished"
    assert (state.state_id, state.step_count, state.stop_reason) == (
        e2e_state,
        len(calls),
        "finished",
    )
    assert state.reward == pytest.approx(reward, abs=EXACT)


def test_budget_truncation_is_in_metadata(toy, toy_bank, e2e_state) -> None:
    """A session past its turn budget ends truncated and scored, the cause in metadata."""
    budgets = toy.spec.budgets.model_copy(update={"max_turns": 2})
    call = ToolCall(name="execute_code", arguments={"language": "bash", "code": "true"})
    native = RubricReward(StageEnv(benchmark=toy, states=toy_bank, budgets=budgets))
    try:
        native.reset(options={"state_id": e2e_state})
        native.step(HERMES.render("", [call]))
        _, reward, _, truncated, info = native.step(HERMES.render("", [call]))
        assert truncated
    finally:
        native.close()
    env = BatOpenEnv("bat/E2E-v0", {"benchmark": toy, "states": toy_bank, "budgets": budgets})
    try:
        env.reset(state_id=e2e_state)
        action = BatAction(tool=call.name, arguments=call.arguments)
        first, last = env.step(action), env.step(action)
    finally:
        env.close()
    assert not first.done and first.metadata["truncated"] is False
    assert last.done and last.metadata["truncated"] is True
    assert last.metadata["terminated"] is False
    assert last.stop_reason == last.metadata["stop_reason"] == info["stop_reason"]
    assert_scored_as(last, reward, info["verdict"])


def test_sessions_do_not_see_each_other(e2e_state, stage_state, server) -> None:
    write = BatAction(
        tool="execute_code",
        arguments={"language": "bash", "code": "echo mine > /workspace/only_a.txt && echo ok"},
    )
    read = BatAction(
        tool="execute_code",
        arguments={"language": "bash", "code": "cat /workspace/only_a.txt || echo absent"},
    )

    async def play():
        async with BatEnvClient(base_url=server) as a, BatEnvClient(base_url=server) as b:
            await asyncio.gather(a.reset(state_id=e2e_state), b.reset(state_id=stage_state))
            await a.step(write)
            seen_a, seen_b = await asyncio.gather(a.step(read), b.step(read))
            return seen_a, seen_b, await a.state(), await b.state()

    seen_a, seen_b, state_a, state_b = asyncio.run(play())
    assert "mine" in seen_a.observation.text
    assert "absent" in seen_b.observation.text and "mine" not in seen_b.observation.text
    assert (state_a.state_id, state_a.step_count) == (e2e_state, 2)
    assert (state_b.state_id, state_b.step_count) == (stage_state, 1)


def test_sessions_past_the_cap_are_refused(server) -> None:
    """The server admits --max-sessions (4 here) WebSocket sessions; one more is refused."""

    async def crowd():
        clients = [BatEnvClient(base_url=server) for _ in range(5)]
        try:
            for client in clients[:4]:
                await client.connect()
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                await clients[4].reset(state_id="any")
        finally:
            for client in clients:
                await client.close()

    asyncio.run(crowd())


def test_bad_actions_give_error_observations(toy, toy_bank, e2e_state, server, in_process) -> None:
    finish = ToolCall(name="finish", arguments={"summary": "stopping"})
    reward, info = in_process(toy, toy_bank, e2e_state, [finish])
    with BatEnvClient(base_url=server).sync() as env:
        early = env.step(BatAction(tool="finish", arguments={"summary": "x"})).observation
        assert early.error and "reset" in early.error and not early.done
        env.reset(state_id=e2e_state)
        unknown = env.step(BatAction(tool="no_such_tool", arguments={})).observation
        bad_args = env.step(BatAction(tool="execute_code", arguments={"code": 3})).observation
        final = env.step(BatAction(tool="finish", arguments=finish.arguments)).observation
        after = env.step(BatAction(tool="finish", arguments=finish.arguments)).observation
    for refused in (unknown, bad_args):
        assert refused.error and "[tool call error]" in refused.text and not refused.done
    assert "no_such_tool" in unknown.error
    assert final.metadata["refused_turns"] == 2
    # The refused calls cost turns but change nothing the rubric reads.
    assert final.reward == pytest.approx(reward, abs=EXACT)
    assert after.error and "ended" in after.error and after.done


def test_trl_tool_methods_play_through_the_server(
    toy, toy_bank, e2e_state, server, in_process
) -> None:
    """TRL's environment_factory path: the tool methods' schemas and one teacher episode."""
    pytest.importorskip("transformers")
    from transformers.utils import get_json_schema

    calls = scripted_calls(toy, toy_bank.get(e2e_state), "teacher")
    reward, info = in_process(toy, toy_bank, e2e_state, calls)
    with BatToolEnvironments(server, benchmark="toy_pipeline") as factory:
        environment = factory()
        schemas = {
            s["function"]["name"]: s["function"] for s in StageEnv(benchmark=toy).tool_schemas
        }
        for name, want in schemas.items():
            got = get_json_schema(getattr(environment, name))["function"]["parameters"]
            assert set(got["properties"]) == set(want["parameters"]["properties"])
            assert set(got.get("required", [])) == set(want["parameters"]["required"])
        assert get_json_schema(environment.execute_code)["function"]["parameters"]["properties"][
            "language"
        ]["enum"] == ["python", "bash"]
        assert environment.reset(state_id=e2e_state, prompt=[]) is None
        for call in calls:
            getattr(environment, call.name)(**call.arguments)
        assert environment.get_reward() == pytest.approx(reward, abs=EXACT)
        assert_scored_as(environment.observation, reward, info["verdict"])


def test_unfinished_rollout_is_finished_for_its_reward(
    toy, toy_bank, e2e_state, in_process
) -> None:
    finish = ToolCall(
        name="finish", arguments={"summary": "[the rollout ended without calling finish]"}
    )
    reward, _ = in_process(toy, toy_bank, e2e_state, [finish])
    factory = BatToolEnvironments(env_kwargs={"benchmark": toy, "states": toy_bank})
    with factory:
        environment = factory()
        environment.reset(state_id=e2e_state)
        assert environment.get_reward() == pytest.approx(reward, abs=EXACT)
        assert environment.observation.stop_reason == "finished"


class ToyBankEnv(BatOpenEnv):
    """What a NeMo Gym config names as env_class: built with no arguments."""

    ENV_KWARGS = {"benchmark": "toy_pipeline"}


def test_nemo_gym_openenv_route(toy, toy_bank, e2e_state, monkeypatch, in_process) -> None:
    """NeMo Gym's OpenEnv resources server (resources_servers/openenv/app.py) builds the
    env_class with no arguments, resets it with the config's reset_kwargs, builds the
    action_class from each "step" tool body and sums the observations' rewards."""
    monkeypatch.setattr(ToyBankEnv, "ENV_KWARGS", {"benchmark": toy, "states": toy_bank})
    calls = scripted_calls(toy, toy_bank.get(e2e_state), "teacher")
    reward, _ = in_process(toy, toy_bank, e2e_state, calls)
    env = ToyBankEnv()
    try:
        first = env.reset(**{"state_id": e2e_state})
        total = float(first.reward or 0.0)
        for call in calls:
            body = {"tool": call.name, "arguments": call.arguments}
            obs = env.step(BatAction(**body))
            total += float(obs.reward or 0.0)
            dumped = obs.model_dump()  # what the "step" tool returns to the agent
            assert dumped["text"] == obs.text
        assert obs.done and total == pytest.approx(reward, abs=EXACT)
    finally:
        env.close()


@pytest.mark.slow  # about 25 s of training on top of the server's start
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers deprecations inside TRL
def test_grpo_step_with_environment_factory_and_no_rollout_func(
    toy, toy_bank, e2e_state, server, tiny_model_dir, tmp_path, monkeypatch, helpers
) -> None:
    """One GRPO step of TRL's own tool loop on a tiny model: the environments play the
    server's sessions, the reward is theirs (get_reward), and no rollout_func is given."""
    pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from bat_gym.integrations.trl import bat_dataset

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    # A chat template TRL parses tool calls of (Qwen3's): the tiny model's own ChatML
    # one has no tool syntax TRL knows.
    tokenizer.chat_template = qwen3_chat_template
    args = helpers.tiny_grpo_config(tmp_path, max_steps=1, max_completion_length=24)
    with BatToolEnvironments(server, benchmark="toy_pipeline") as environments:
        trainer = GRPOTrainer(
            model=str(tiny_model_dir),
            args=args,
            train_dataset=bat_dataset(toy_bank, state_ids=[e2e_state]),
            processing_class=tokenizer,
            environment_factory=environments,
        )
        assert trainer.rollout_func is None
        tools = {t.__name__ for t in trainer.tools}
        assert tools == {"execute_code", "finish"}
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        played = [e for e in environments.made if e.observation is not None]
        rewards = [e.get_reward() for e in played]
        ended = [e.observation for e in played]

    assert trainer.state.global_step == 1
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    # Both rollouts of the group played the row's state to a verdict, on the server.
    assert len(played) == 2
    assert all(o.state_id == e2e_state and o.done and o.verdict for o in ended)
    name = environments.environment_class.__name__
    logged = [h for h in trainer.state.log_history if f"rewards/{name}/mean" in h]
    assert logged and logged[0][f"rewards/{name}/mean"] == pytest.approx(sum(rewards) / 2)
