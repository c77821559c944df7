"""A benchmark's own tool, end to end through every adapter, with no adapter change.

The benchmark (``tests/tool_bench.py``) adds ``lookup_case`` (and others) to the toy
pipeline, and its teacher calls ``lookup_case`` in its first turn. Each adapter plays
the teacher from the same state as the native env: the prompt carries the tool's
schema, the call's result comes back as the native env returns it, the execution
record holds it, and the reward agrees.
"""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest
from tool_bench import ToolBench

from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.rollout import TokenEpisode
from bat_gym.rollout.chat_tokens import render_ids

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bench():
    return ToolBench()


@pytest.fixture(scope="module")
def states(bench, tmp_path_factory):
    store = BlobStore(tmp_path_factory.mktemp("tool-states") / "store")
    return MemoryStates(store, [initial_state(bench, 5, "threshold", store, "hermes")])


@pytest.fixture(scope="module")
def reference(bench, states, tiny_tokenizer, helpers):
    """The native run of the teacher: prompt ids, observations, reward."""
    state = states.get(states.select()[0])
    actions = helpers.teacher_actions(bench, state)
    env = gym.make("bat/E2E-v0", benchmark=bench, states=states)
    try:
        _, info = env.reset(options={"state_id": state.state_id})
        assert any(t["function"]["name"] == "lookup_case" for t in info["tools"])
        prompt_ids = render_ids(
            tiny_tokenizer, info["messages"], info["tools"], add_generation_prompt=True
        )
        observations = []
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            observations.append(obs)
            if terminated or truncated:
                break
        assert terminated
        (use,) = info["record"].tool_uses
        assert use.name == "lookup_case" and use.status == "ok"
        assert info["verdict"].reward >= 0.9
        return state, actions, prompt_ids, observations, float(reward)
    finally:
        env.close()


def test_the_prompt_renders_the_tool_schema(reference, tiny_tokenizer):
    _, _, prompt_ids, observations, _ = reference
    text = tiny_tokenizer.decode(prompt_ids)
    assert '"name": "lookup_case"' in text and "^case\\\\d{3}$" in text
    assert "[lookup_case: ok]" in observations[0]


def test_token_episode(bench, states, reference, tiny_tokenizer, helpers):
    state, actions, prompt_ids, observations, reward = reference
    env = gym.make("bat/E2E-v0", benchmark=bench, states=states)
    try:
        gen = helpers.ScriptedTokens(tiny_tokenizer, actions)
        result = TokenEpisode(env, tiny_tokenizer).run(gen, state_id=state.state_id)
    finally:
        env.close()
    assert list(result.prompt_ids) == list(prompt_ids)
    assert list(result.observations) == observations
    assert result.reward == reward


def test_trl_rollout(bench, states, reference, tiny_tokenizer, helpers):
    from bat_gym.integrations.trl import BatRollout, bat_dataset

    state, actions, prompt_ids, observations, reward = reference
    (row,) = bat_dataset(states, state_ids=[state.state_id])
    gens = [helpers.ScriptedTokens(tiny_tokenizer, actions)]
    with BatRollout("bat/E2E-v0", env_kwargs={"benchmark": bench, "states": states}) as rollout:
        trainer = helpers.fake_trl_trainer(rollout, [row], tiny_tokenizer)
        rollout.generate = helpers.RoutedBatch(gens, [prompt_ids])
        out = rollout([row["prompt"]], trainer)
        (result,) = rollout.last_results
    assert list(out["prompt_ids"][0]) == list(prompt_ids)
    assert list(result.observations) == observations
    assert out["bat_reward"][0] == reward


def test_verl_agent_loop(bench, states, reference, tiny_tokenizer, helpers, verl_loop):
    pytest.importorskip("omegaconf")
    BatAgentLoop, _, real = verl_loop
    state, actions, prompt_ids, _, reward = reference
    gen = helpers.ScriptedTokens(tiny_tokenizer, actions)

    async def play():
        loop = helpers.make_verl_loop(
            BatAgentLoop,
            real,
            helpers.verl_trainer_config(),
            helpers.ScriptedServer(gen),
            tiny_tokenizer,
            env="bat/E2E-v0",
            env_kwargs={"benchmark": bench, "states": states},
        )
        return await loop.run(
            {"temperature": 1.0}, raw_prompt=[], extra_info={"state_id": state.state_id}
        )

    out = asyncio.run(play())
    assert list(out.prompt_ids) == list(prompt_ids)
    assert out.reward_score == reward
    assert '"id": "' in tiny_tokenizer.decode(out.response_ids)  # lookup_case's result


def test_skyrl_text_env(bench, states, reference, helpers):
    pytest.importorskip("skyrl_gym")
    from bat_gym.integrations.skyrl import BatTextEnv, chat_template_kwargs

    state, actions, _, observations, reward = reference
    env = BatTextEnv(
        {"env": "bat/E2E-v0", "env_kwargs": {"benchmark": bench, "states": states}},
        {"state_id": state.state_id},
    )
    try:
        _, meta = env.init([])
        outs = [env.step(a) for a in actions]
    finally:
        env.close()
    assert meta["tools"] == chat_template_kwargs(bench)["tools"]
    first = "\n\n".join(m["content"] for m in outs[0]["observations"])
    assert first == observations[0]
    assert outs[-1]["reward"] == reward
