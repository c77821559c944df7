import asyncio

import gymnasium as gym
import pytest
import yaml

from bat_gym.integrations.verl import (
    AGENT_NAME,
    agent_loop_config,
    agent_loop_fields,
    run_episode,
    verl_dataset,
)

pytest.importorskip("transformers")


def state_of(bank, focus, track="threshold"):
    return bank.get(bank.select(focus=focus, track=track)[0])


def test_rows_carry_the_state_in_extra_info(toy_bank):
    ds = verl_dataset(toy_bank, focus="S2")
    assert len(ds) == len(toy_bank.select(focus="S2"))
    row = ds[0]
    assert row["agent_name"] == AGENT_NAME and row["data_source"] == "bat_gym/toy_pipeline"
    assert row["extra_info"]["state_id"] == toy_bank.select(focus="S2")[0]
    assert row["extra_info"]["index"] == 0 and row["prompt"][0]["role"] == "system"


def test_the_agent_loop_config_names_the_class_and_the_env(tmp_path):
    path = agent_loop_config(
        tmp_path / "agent.yaml",
        env="bat/Validate-v0",
        env_kwargs={"states": "banks/med"},
        max_new_tokens_per_turn=512,
    )
    (entry,) = yaml.safe_load(path.read_text())
    assert entry == {
        "name": "bat_gym",
        "_target_": "bat_gym.integrations.verl.BatAgentLoop",
        "env": "bat/Validate-v0",
        "env_kwargs": {"states": "banks/med"},
        "max_new_tokens_per_turn": 512,
    }


def test_an_async_episode_maps_onto_agent_loop_output_fields(
    toy, toy_bank, tiny_tokenizer, helpers
):
    state = state_of(toy_bank, "S5")
    gen = helpers.ScriptedTokens(tiny_tokenizer, helpers.script(toy, state, "teacher"))

    async def generate(context_ids, max_new):
        await asyncio.sleep(0)
        tokens = gen(context_ids)
        return tokens, [-0.5] * len(tokens)

    env = gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank)
    try:
        result = asyncio.run(
            run_episode(
                env, tiny_tokenizer, generate, state_id=state.state_id, max_response_tokens=4096
            )
        )
    finally:
        env.close()
    fields = agent_loop_fields(result)
    assert fields["prompt_ids"] == result.prompt_ids
    assert fields["response_ids"] == result.response_ids
    assert fields["response_mask"] == result.response_mask
    assert fields["reward_score"] == pytest.approx(1.0)
    # verl counts chat turns: the prompt, every assistant turn, every env reply appended.
    assert fields["num_turns"] == 1 + 2 + 1
    lp = fields["response_logprobs"]
    assert [x for x, m in zip(lp, result.response_mask, strict=True) if m] == [-0.5] * sum(
        result.response_mask
    )
    assert {x for x, m in zip(lp, result.response_mask, strict=True) if not m} == {0.0}
    info = fields["extra_fields"]["reward_extra_info"]
    assert info == {
        "state_id": state.state_id,
        "stop_reason": "terminated",
        "verdict_null": False,
        "task_score": None,
    }


def test_the_agent_loop_plays_the_rows_state(toy, toy_bank, tiny_tokenizer, helpers, verl_loop):
    pytest.importorskip("omegaconf")
    BatAgentLoop, AgentLoopOutput, real = verl_loop
    state = state_of(toy_bank, "S5")
    gen = helpers.ScriptedTokens(tiny_tokenizer, helpers.script(toy, state, "teacher"))
    server = helpers.ScriptedServer(gen)
    bank_dir = str(toy_bank.root)

    async def play():
        loop = helpers.make_verl_loop(
            BatAgentLoop,
            real,
            helpers.verl_trainer_config(response_length=2048),
            server,
            tiny_tokenizer,
            env="bat/E2E-v0",
            env_kwargs={"benchmark": "toy_pipeline", "states": bank_dir},
            name="bat_gym",  # verl passes the config entry's name along
        )
        return await loop.run(
            {"temperature": 1.0, "top_p": 1.0},
            raw_prompt=[],
            agent_name="bat_gym",
            extra_info={"state_id": state.state_id, "index": 0},
        )

    out = asyncio.run(play())
    assert isinstance(out, AgentLoopOutput)
    assert BatAgentLoop.__module__ == "bat_gym.integrations.verl"
    assert out.reward_score == pytest.approx(1.0)
    assert sum(out.response_mask) == sum(len(t) for t in gen.turns)
    assert out.extra_fields["reward_extra_info"]["state_id"] == state.state_id
    # One request id per episode (verl keeps it on one server); the budget rides along.
    assert len({rid for rid, _ in server.calls}) == 1
    first, second = (params["max_tokens"] for _, params in server.calls)
    assert first == 2048 and second == 2048 - len(gen.turns[0]) - out.response_mask.count(0)
    assert server.calls[0][1]["temperature"] == 1.0


def test_the_agent_loop_needs_verl_or_says_how_to_get_it(monkeypatch):
    import sys

    import bat_gym.integrations.verl as bat_verl

    monkeypatch.setattr(bat_verl, "_built", {})
    for name in [m for m in sys.modules if m.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)  # imported already where verl is installed
    monkeypatch.setitem(sys.modules, "verl", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'bat-gym\[verl\]'"):
        _ = bat_verl.BatAgentLoop
    with pytest.raises(AttributeError):
        _ = bat_verl.NoSuchThing


def test_a_dependency_verl_leaves_out_is_named(monkeypatch, tmp_path):
    """verl 0.9's agent loop imports cachetools, uvicorn and fastapi without requiring
    them: the message names the missing one, not verl."""
    import sys

    import bat_gym.integrations.verl as bat_verl

    loop = tmp_path / "verl" / "experimental" / "agent_loop"
    loop.mkdir(parents=True)
    for d in (tmp_path / "verl", loop.parent, loop):
        (d / "__init__.py").write_text("")
    (loop / "agent_loop.py").write_text("import cachetools\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cachetools", None)  # as if not installed
    monkeypatch.setattr(bat_verl, "_built", {})
    try:
        with pytest.raises(ImportError, match="verl is installed, but .* imports 'cachetools'"):
            _ = bat_verl.BatAgentLoop
    finally:
        # The stand-in's packages were imported: left in sys.modules, a later test in this
        # process would find "verl" installed (monkeypatch restores what it removed).
        for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
            del sys.modules[name]


def _have_verl() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("verl.experimental.agent_loop.agent_loop") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(
    not _have_verl(), reason="verl is not installed; the agent loop was checked on a stand-in base"
)
def test_the_installed_verl_base_is_the_one_subclassed(verl_loop):
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    BatAgentLoop, _, real = verl_loop
    assert real and issubclass(BatAgentLoop, AgentLoopBase)
