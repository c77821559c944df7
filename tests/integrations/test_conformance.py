"""Every adapter plays the same states with the same scripted turns as the native env API.

For each case the native run (``reset(options={"state_id": ...})`` then ``step`` per
action) is the reference. Each adapter must show the model the same prompt, return the
same tool results, give the same reward, and mask exactly the env's tokens: sampled
turns 1, env replies 0. Tool results name no run time, so the texts must agree exactly.
"""

import asyncio

import gymnasium as gym
import pytest

from bat_gym.rollout import TokenEpisode
from bat_gym.rollout.chat_tokens import render_ids

pytest.importorskip("transformers")

CASES = [
    ("S5", "lookup", "teacher"),
    ("S3", "threshold", "malformed"),
    ("E2E", "lookup", "teacher"),
    ("S2", "threshold", "finish"),
]


def native(toy, toy_bank, state, actions, tok, helpers):
    """The reference: the env driven through Gymnasium's API, and the token view a chat
    template gives of its conversation."""
    env = gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank)
    try:
        _, info = env.reset(options={"state_id": state.state_id})
        tools = info["tools"]
        prompt_messages = list(info["messages"])
        observations, replies = [], []
        for action in actions:
            before = list(info["messages"])
            obs, reward, terminated, truncated, info = env.step(action)
            observations.append(obs)
            if terminated or truncated:
                break
            # The reply as text: the conversation with the new messages, minus the one
            # without them cut after its last end-of-turn token.
            head = tok.apply_chat_template(
                info["messages"][: len(before) + 1], tools=tools, tokenize=False
            )
            full = tok.apply_chat_template(
                info["messages"], tools=tools, tokenize=False, add_generation_prompt=True
            )
            head = head[: head.rindex(tok.eos_token) + len(tok.eos_token)]
            assert full.startswith(head)
            replies.append(full[len(head) :])
        assert terminated or truncated
        return {
            "prompt_messages": prompt_messages,
            "prompt_ids": render_ids(tok, prompt_messages, tools, add_generation_prompt=True),
            "observations": list(observations),
            "replies": replies,
            "reward": float(reward),
            "verdict_reward": info["verdict"].reward,
            "messages": [{**m, "content": str(m.get("content"))} for m in info["messages"]],
        }
    finally:
        env.close()


def token_view(tok, prompt_ids, response_ids, response_mask, helpers):
    """Prompt, sampled turns (mask 1) and replies (mask 0, as normalized text)."""
    assert len(response_ids) == len(response_mask) and set(response_mask) <= {0, 1}
    runs, start = [], 0
    for i in range(1, len(response_mask) + 1):
        if i == len(response_mask) or response_mask[i] != response_mask[start]:
            runs.append((response_mask[start], response_ids[start:i]))
            start = i
    assert [v for v, _ in runs] == [1, 0] * (len(runs) // 2) + [1]  # turn, reply, ..., turn
    return {
        "prompt_ids": list(prompt_ids),
        "sampled": [ids for v, ids in runs if v == 1],
        "replies": [tok.decode(ids) for v, ids in runs if v == 0],
    }


def check_tokens(view, ref, gen):
    assert view["prompt_ids"] == ref["prompt_ids"]
    assert view["sampled"] == gen.turns  # every sampled token is in the loss, unchanged
    assert view["replies"] == ref["replies"]  # every env token is out of it


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def case(request, toy, toy_bank, tiny_tokenizer, helpers):
    focus, track, kind = request.param
    state = toy_bank.get(toy_bank.select(focus=focus, track=track)[0])
    actions = helpers.script(toy, state, kind)
    ref = native(toy, toy_bank, state, actions, tiny_tokenizer, helpers)
    if kind == "teacher":
        assert ref["reward"] == pytest.approx(1.0)
    else:
        assert ref["reward"] < 1.0
    return state, actions, ref


def test_the_shared_token_episode(case, toy, toy_bank, tiny_tokenizer, helpers):
    state, actions, ref = case
    gen = helpers.ScriptedTokens(tiny_tokenizer, actions)
    env = gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank)
    try:
        result = TokenEpisode(env, tiny_tokenizer).run(gen, state_id=state.state_id)
    finally:
        env.close()
    view = token_view(
        tiny_tokenizer, result.prompt_ids, result.response_ids, result.response_mask, helpers
    )
    check_tokens(view, ref, gen)
    assert list(result.observations) == ref["observations"]
    assert result.reward == ref["reward"] and result.verdict.reward == ref["verdict_reward"]
    assert [{**m, "content": str(m.get("content"))} for m in result.messages] == ref["messages"]


def test_trl_rollout(case, toy, toy_bank, tiny_tokenizer, helpers):
    from bat_gym.integrations.trl import BatRollout, bat_dataset, rubric_reward

    state, actions, ref = case
    (row,) = bat_dataset(toy_bank, state_ids=[state.state_id])
    rows = [row, row]  # a GRPO group of two
    gens = [helpers.ScriptedTokens(tiny_tokenizer, actions) for _ in rows]
    with BatRollout("bat/E2E-v0", env_kwargs={"benchmark": toy, "states": toy_bank}) as rollout:
        trainer = helpers.fake_trl_trainer(rollout, rows, tiny_tokenizer)
        rollout.generate = helpers.RoutedBatch(gens, [ref["prompt_ids"]] * 2)
        out = rollout([r["prompt"] for r in rows], trainer)
        results = rollout.last_results
    rewards = rubric_reward(
        ["c", "c"],
        bat_reward=out["bat_reward"],
        bat_state_id=out["bat_state_id"],
        state_id=[r["state_id"] for r in rows],
    )
    for i, gen in enumerate(gens):
        view = token_view(
            tiny_tokenizer,
            out["prompt_ids"][i],
            out["completion_ids"][i],
            out["env_mask"][i],
            helpers,
        )
        check_tokens(view, ref, gen)
        assert list(results[i].observations) == ref["observations"]
        assert rewards[i] == ref["reward"]


def test_verl_agent_loop(case, tiny_tokenizer, toy_bank, helpers, verl_loop):
    pytest.importorskip("omegaconf")
    BatAgentLoop, AgentLoopOutput, real = verl_loop
    state, actions, ref = case
    gen = helpers.ScriptedTokens(tiny_tokenizer, actions)

    async def play():
        loop = helpers.make_verl_loop(
            BatAgentLoop,
            real,
            helpers.verl_trainer_config(),
            helpers.ScriptedServer(gen),
            tiny_tokenizer,
            env="bat/E2E-v0",
            env_kwargs={"benchmark": "toy_pipeline", "states": str(toy_bank.root)},
        )
        return await loop.run(
            {"temperature": 1.0}, raw_prompt=[], extra_info={"state_id": state.state_id}
        )

    out = asyncio.run(play())
    assert isinstance(out, AgentLoopOutput)
    view = token_view(tiny_tokenizer, out.prompt_ids, out.response_ids, out.response_mask, helpers)
    check_tokens(view, ref, gen)
    assert out.reward_score == ref["reward"]
    assert out.num_turns == 1 + len(gen.turns) + len(ref["replies"])


def test_skyrl_text_env(case, tiny_tokenizer, toy_bank, helpers):
    pytest.importorskip("skyrl_gym")
    from bat_gym.integrations.skyrl import BatTextEnv, chat_template_kwargs

    state, actions, ref = case
    tok = tiny_tokenizer
    env = BatTextEnv(
        {
            "env": "bat/E2E-v0",
            "env_kwargs": {"benchmark": "toy_pipeline", "states": str(toy_bank.root)},
        },
        {"state_id": state.state_id},
    )
    try:
        messages, _ = env.init([])
        outs = [env.step(a) for a in actions]
    finally:
        env.close()
    assert messages == ref["prompt_messages"]
    seen = [m["content"] for o in outs[:-1] for m in o["observations"]]
    assert seen + [outs[-1]["metadata"]["final_observation"]] == ref["observations"]
    assert outs[-1]["done"] and not any(o["done"] for o in outs[:-1])
    assert outs[-1]["reward"] == ref["reward"]

    # SkyRL tokenizes itself: prompt with the generator's chat_template_kwargs, and each
    # step's observations as the template's text after a fixed base conversation (its
    # token-in-token-out mode). Done the same way here, it gives the same tokens and masks.
    kwargs = chat_template_kwargs()
    prompt_ids = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    base_ids = tok.apply_chat_template(base, tokenize=True, return_dict=False, **kwargs)
    base_ids = base_ids[: len(base_ids) - base_ids[::-1].index(tok.eos_token_id)]
    gen = helpers.ScriptedTokens(tok, actions)
    response, mask = [], []
    for turn, out in zip(gen.turns, outs, strict=True):
        response += turn
        mask += [1] * len(turn)
        if out["observations"]:
            obs_ids = tok.apply_chat_template(
                base + out["observations"],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )[len(base_ids) :]
            response += obs_ids
            mask += [0] * len(obs_ids)
    check_tokens(token_view(tok, prompt_ids, response, mask, helpers), ref, gen)
