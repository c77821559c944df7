import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from bat_gym.core.protocol import TOOLS  # noqa: E402
from bat_gym.integrations.skyrl import (  # noqa: E402
    ENV_CLASS,
    BatTextEnv,
    chat_template_kwargs,
    register_env,
    skyrl_dataset,
)


def state_of(bank, focus, track="lookup"):
    return bank.get(bank.select(focus=focus, track=track)[0])


def test_rows_name_the_env_class_and_the_state(toy_bank):
    ds = skyrl_dataset(toy_bank, focus="S4")
    assert len(ds) == len(toy_bank.select(focus="S4"))
    assert set(ds["env_class"]) == {ENV_CLASS}
    assert ds[0]["state_id"] == toy_bank.select(focus="S4")[0]
    assert ds[0]["extra_info"] == {"focus": "S4", "track": ds[0]["extra_info"]["track"]}


def test_the_registered_env_plays_the_teacher_to_the_rubric_reward(toy, toy_bank, helpers):
    register_env()
    register_env()  # idempotent
    state = state_of(toy_bank, "S5")
    env = skyrl_gym.make(
        ENV_CLASS,
        # SkyRL passes its per-env config and the row's extras (here in extra_info).
        env_config={
            "env": "bat/E2E-v0",
            "env_kwargs": {"benchmark": "toy_pipeline", "states": str(toy_bank.root)},
        },
        extras={"extra_info": {"state_id": state.state_id}, "max_turns": 5},
    )
    assert isinstance(env, BatTextEnv)
    try:
        messages, meta = env.init([{"role": "user", "content": "ignored: the env owns the prompt"}])
        assert messages == [dict(m) for m in state.messages]
        assert meta["state_id"] == state.state_id and meta["tools"] == list(TOOLS)
        actions = helpers.script(toy, state, "teacher")
        outs = [env.step(a) for a in actions]
    finally:
        env.close()
    *middle, last = outs
    for out in middle:
        assert not out["done"] and out["reward"] == 0.0
        assert [m["role"] for m in out["observations"]] == ["tool"]
        assert out["observations"][0]["content"].startswith("[exit code 0")
    assert last["done"] and last["observations"] == []
    assert last["reward"] == pytest.approx(1.0)
    assert last["metadata"]["final_observation"] == "Finished."
    assert last["metadata"]["verdict"]["reward"] == pytest.approx(1.0)
    metrics = env.get_metrics()
    assert metrics["turns"] == len(actions) and metrics["reward"] == pytest.approx(1.0)


def test_a_malformed_turn_comes_back_as_a_user_message(toy, toy_bank, helpers):
    state = state_of(toy_bank, "S3")
    env = BatTextEnv(
        {"env_kwargs": {"benchmark": "toy_pipeline", "states": str(toy_bank.root)}},
        {"state_id": state.state_id},
    )
    try:
        env.init([])
        out = env.step(helpers.script(toy, state, "malformed")[0])
    finally:
        env.close()
    (message,) = out["observations"]
    assert message["role"] == "user" and message["content"].startswith("[tool call error]")


def test_the_prompt_needs_the_tools_in_the_chat_template_kwargs(tiny_tokenizer, toy_bank):
    # SkyRL renders prompts without tools unless its chat_template_kwargs carry them.
    messages = [dict(m) for m in state_of(toy_bank, "S1").messages]
    with_tools = tiny_tokenizer.apply_chat_template(
        messages, tokenize=False, **chat_template_kwargs()
    )
    assert '"additionalProperties"' in with_tools
    assert '"additionalProperties"' not in tiny_tokenizer.apply_chat_template(
        messages, tokenize=False
    )


def test_a_row_without_a_state_is_refused_and_step_needs_init():
    with pytest.raises(KeyError, match="names no state"):
        BatTextEnv({}, {"extra_info": {}})
    with pytest.raises(RuntimeError, match="init"):
        BatTextEnv({}, {"state_id": "x"}).step("hi")
