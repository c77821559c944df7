import gymnasium as gym
import pytest

from bat_gym.env import StageEnv
from bat_gym.integrations import ChatTemplateError, TokenEpisode
from bat_gym.integrations._episode import delta_ids, render_ids, rubric_wrapper

pytest.importorskip("transformers")


@pytest.fixture
def env(toy, toy_bank):
    env = gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank)
    yield env
    env.close()


def runs(mask):
    """(value, start, end) of each run of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def state_of(bank, focus, track="lookup"):
    return bank.get(bank.select(focus=focus, track=track)[0])


def test_the_teacher_script_plays_token_in_token_out(helpers, env, toy, toy_bank, tiny_tokenizer):
    tok = tiny_tokenizer
    state = state_of(toy_bank, "S5")
    actions = helpers.script(toy, state, "teacher")
    gen = helpers.ScriptedTokens(tok, actions)
    episode = TokenEpisode(env, tok)
    prompt = episode.reset(state.state_id)
    assert prompt == render_ids(tok, state.messages, episode._tools, add_generation_prompt=True)

    result = episode.run(gen)

    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    assert result.verdict.reward == pytest.approx(1.0)
    assert result.num_turns == len(actions) and result.num_replies == len(actions) - 1
    assert len(result.response_ids) == len(result.response_mask)
    # Sampled turns (mask 1) are exactly the script's tokens; replies (mask 0) sit between.
    segments = runs(result.response_mask)
    sampled = [result.response_ids[a:b] for v, a, b in segments if v == 1]
    assert sampled == gen.turns
    replies = [tok.decode(result.response_ids[a:b]) for v, a, b in segments if v == 0]
    assert len(replies) == len(actions) - 1
    for reply, obs in zip(replies, result.observations, strict=False):
        assert reply.startswith("\n<|im_start|>user\n<tool_response>\n")
        assert helpers.normalize(obs) in helpers.normalize(reply)
        assert reply.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # Each turn was conditioned on everything before it, and nothing else.
    assert gen.contexts[0] == prompt
    assert gen.contexts[-1] == result.prompt_ids + result.response_ids[: -len(gen.turns[-1])]
    assert result.response_ids[-1] == tok.eos_token_id  # ends on the model's own token


def test_a_malformed_turn_gets_the_env_error_as_reply(helpers, env, toy, toy_bank, tiny_tokenizer):
    state = state_of(toy_bank, "S3")
    result = TokenEpisode(env, tiny_tokenizer).run(
        helpers.ScriptedTokens(tiny_tokenizer, helpers.script(toy, state, "malformed")),
        state_id=state.state_id,
    )
    zero = [t for t, m in zip(result.response_ids, result.response_mask, strict=True) if m == 0]
    assert "[tool call error]" in tiny_tokenizer.decode(zero)
    assert result.messages[-3]["role"] == "user"  # the error, then the finish turn
    assert result.stop_reason == "terminated" and result.reward < 1.0


def test_the_token_budget_cuts_and_scores_the_episode(helpers, env, toy, toy_bank, tiny_tokenizer):
    state = state_of(toy_bank, "S5")
    gen = helpers.ScriptedTokens(tiny_tokenizer, helpers.script(toy, state, "teacher"))
    budget = len(gen.turns[0]) + 5  # the first turn fits, its reply does not
    result = TokenEpisode(env, tiny_tokenizer, max_response_tokens=budget).run(
        gen, state_id=state.state_id
    )
    assert result.stop_reason == "length"
    assert result.response_mask == [1] * len(gen.turns[0])
    assert result.verdict is not None and rubric_wrapper(env).last_verdict is result.verdict
    assert result.reward == (result.verdict.reward or 0.0)

    # A turn longer than the room left is cut and never reaches the env.
    episode = TokenEpisode(env, tiny_tokenizer, max_response_tokens=7)
    episode.reset(state.state_id)
    assert episode.max_new_tokens == 7
    assert episode.advance(gen.turns[0])
    cut = episode.result()
    assert cut.response_ids == gen.turns[0][:7] and cut.num_turns == 1
    assert cut.observations == [] and cut.info["turns"] == 0


def test_a_turn_capped_before_its_stop_token_is_closed_by_the_reply(
    env, toy, toy_bank, tiny_tokenizer
):
    tok = tiny_tokenizer
    state = state_of(toy_bank, "S3")
    episode = TokenEpisode(env, tok, max_new_tokens_per_turn=5)
    episode.reset(state.state_id)
    assert episode.max_new_tokens == 5
    open_turn = tok.encode("thinking about", add_special_tokens=False)[:5]
    assert not episode.advance(open_turn, logprobs=[-0.5] * len(open_turn))
    n = len(open_turn)
    assert episode.response_mask[:n] == [1] * n and episode.response_mask[n] == 0
    assert episode.response_ids[n] == tok.eos_token_id  # closed by the reply, not sampled
    assert episode._logprobs[:n] == [-0.5] * n and set(episode._logprobs[n:]) == {0.0}


def test_the_bare_env_gives_reward_zero_and_no_verdict(helpers, toy, toy_bank, tiny_tokenizer):
    env = StageEnv("S5", benchmark=toy, states=toy_bank)
    try:
        state = state_of(toy_bank, "S5")
        result = TokenEpisode(env, tiny_tokenizer).run(
            helpers.ScriptedTokens(tiny_tokenizer, helpers.script(toy, state, "teacher")),
            state_id=state.state_id,
        )
        assert rubric_wrapper(env) is None
        assert result.reward == 0.0 and result.verdict is None and result.reward_or_none == 0.0
        assert result.response_logprobs is None  # the generator gave none
    finally:
        env.close()


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_tokenizer):
    tok = tiny_tokenizer
    original = tok.chat_template
    tok.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') }}"
        "{%- if loop.last %} (latest){% endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    try:
        before = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ls"}]
        with pytest.raises(ChatTemplateError, match="prefix-preserving"):
            delta_ids(tok, before, [{"role": "user", "content": "x"}], None, stop_token_ids={2})
    finally:
        tok.chat_template = original


def test_arguments_and_call_order_are_checked(env, toy_bank, tiny_tokenizer):
    with pytest.raises(ValueError, match="max_response_tokens must be a positive"):
        TokenEpisode(env, tiny_tokenizer, max_response_tokens=0)
    episode = TokenEpisode(env, tiny_tokenizer)
    with pytest.raises(RuntimeError, match="call reset"):
        episode.advance([1, 2])
    with pytest.raises(RuntimeError, match="not ended"):
        episode.result()
    episode.reset(state_of(toy_bank, "S5").state_id)
    with pytest.raises(ValueError, match="one logprob per sampled token"):
        episode.advance([5, 6], logprobs=[0.0])
