import gymnasium as gym
import pytest

from bat_gym.env import StageEnv
from bat_gym.policies import PolicyRequest
from bat_gym.policies.local import chat_messages
from bat_gym.rollout import ChatTemplateError, TokenEpisode
from bat_gym.rollout.chat_tokens import default_stop_token_ids, delta_ids, render_ids, reply_delta
from bat_gym.rollout.token_episode import PromptTooLong, rubric_wrapper

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
        assert obs in reply
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
    assert result.stop_reason == "length" and result.length_limit == "response"
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


def test_a_turn_capped_before_its_stop_token_is_closed_by_the_reply_when_acted_on(
    env, toy, toy_bank, tiny_tokenizer
):
    tok = tiny_tokenizer
    state = state_of(toy_bank, "S3")
    episode = TokenEpisode(env, tok, max_new_tokens_per_turn=5, cut_turn="act")
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


# -- what ends a turn -------------------------------------------------------------------


class Recorded:
    """A scripted generator that also keeps, per turn, the env's conversation and the
    ``max_new_tokens`` it was asked for."""

    def __init__(self, gen, episode) -> None:
        self.gen, self.episode = gen, episode
        self.conversations: list[list[dict]] = []
        self.max_new: list[int | None] = []

    def __call__(self, context_ids, max_new_tokens=None):
        self.conversations.append(list(self.episode._info["messages"]))
        self.max_new.append(max_new_tokens)
        return self.gen(context_ids, max_new_tokens)


def evaluation_prompt(policy, messages, tools):
    """The tokens evaluation conditions a turn on: the policy renders the conversation."""
    return policy.prompt_token_ids(PolicyRequest(messages=messages, tools=tools))


@pytest.fixture(scope="module")
def endoftext_policy(endoftext_model_dir):
    from bat_gym.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(endoftext_model_dir, device="cpu")
    yield policy
    policy.close()


def test_a_turn_ending_in_im_end_is_complete_when_the_eos_is_endoftext(
    helpers, env, toy, toy_bank, endoftext_policy
):
    tok = endoftext_policy.tokenizer
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token_id == endoftext
    # The sampler stops at both; the episode's default agrees, end-of-turn first.
    assert endoftext_policy.stop_token_ids == {im_end, endoftext}
    assert default_stop_token_ids(tok) == [im_end, endoftext]
    state = state_of(toy_bank, "S5")
    actions = helpers.script(toy, state, "teacher")
    episode = TokenEpisode(env, tok)
    gen = Recorded(helpers.ScriptedTokens(tok, actions, end="<|im_end|>"), episode)
    result = episode.run(gen, state_id=state.state_id)

    assert result.stop_reason == "terminated" and result.num_turns == len(actions)
    assert result.reward == pytest.approx(1.0)
    tools = episode._tools
    for context, messages in zip(gen.gen.contexts, gen.conversations, strict=True):
        assert endoftext not in context
        # What evaluation renders for the same conversation, token for token.
        assert context == evaluation_prompt(endoftext_policy, messages, tools)
        assert context == render_ids(
            tok, chat_messages(messages), tools, add_generation_prompt=True
        )
    # After a sampled turn: its own <|im_end|>, once, then the template's newline.
    second = tok.decode(gen.gen.contexts[1][len(result.prompt_ids) :])
    assert second.count("<|im_end|>") == 2  # the sampled one, and the tool result's
    assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>" in second


# -- token limits -----------------------------------------------------------------------


def test_a_turn_cut_by_the_per_turn_cap_ends_the_episode_without_acting_on_it(
    helpers, env, toy, toy_bank, tiny_tokenizer
):
    tok = tiny_tokenizer
    state = state_of(toy_bank, "S5")
    actions = helpers.script(toy, state, "teacher")
    first = tok.encode(actions[0], add_special_tokens=False) + [tok.eos_token_id]
    cap = len(first)  # the first turn fits; the second runs into the cap
    episode = TokenEpisode(env, tok, max_new_tokens_per_turn=cap)
    episode.reset(state.state_id)
    assert not episode.advance(first)
    cut = (tok.encode(actions[1], add_special_tokens=False) * cap)[:cap]
    assert tok.eos_token_id not in cut
    assert episode.advance(cut, logprobs=[-0.5] * cap)

    result = episode.result()
    assert result.stop_reason == "length" and result.length_limit == "turn"
    assert result.num_turns == 2 and result.num_replies == 1
    assert result.response_ids[-cap:] == cut and result.response_mask[-cap:] == [1] * cap
    assert result.response_logprobs is None  # the first turn came without logprobs
    # The env stepped the first turn only: the cut text never ran.
    assert result.info["turns"] == 1 and len(result.observations) == 1
    assert result.verdict is not None and result.reward == (result.verdict.reward or 0.0)


def test_max_total_tokens_caps_prompt_plus_response(helpers, env, toy, toy_bank, tiny_tokenizer):
    tok = tiny_tokenizer
    state = state_of(toy_bank, "S5")
    actions = helpers.script(toy, state, "teacher")
    prompt = TokenEpisode(env, tok).reset(state.state_id)
    first = tok.encode(actions[0], add_special_tokens=False) + [tok.eos_token_id]
    cap = len(prompt) + len(first) + 5  # the first turn fits, its reply does not
    episode = TokenEpisode(env, tok, max_total_tokens=cap, max_new_tokens_per_turn=4096)
    gen = Recorded(helpers.ScriptedTokens(tok, actions), episode)
    result = episode.run(gen, state_id=state.state_id)
    assert result.stop_reason == "length" and result.length_limit == "total"
    assert len(result.prompt_ids) + len(result.response_ids) <= cap
    assert result.response_ids == first and result.info["turns"] == 1
    # Each turn may sample only what still fits.
    assert gen.max_new == [cap - len(prompt)]

    # A turn longer than the room left is cut to it and never reaches the env.
    episode = TokenEpisode(env, tok, max_total_tokens=len(prompt) + 7)
    episode.reset(state.state_id)
    assert episode.max_new_tokens == 7
    assert episode.advance(first)
    cut = episode.result()
    assert cut.response_ids == first[:7] and cut.length_limit == "total"
    assert cut.info["turns"] == 0

    # A prompt that fills the context ends the episode before any turn.
    episode = TokenEpisode(env, tok, max_total_tokens=len(prompt))
    episode.reset(state.state_id)
    assert episode.done
    short = episode.result()
    assert short.stop_reason == "length" and short.length_limit == "total"
    assert short.num_turns == 0 and short.response_ids == []

    # One longer than the context can be neither sampled nor trained on: said at once.
    episode = TokenEpisode(env, tok, max_total_tokens=len(prompt) - 1)
    with pytest.raises(PromptTooLong, match=f"is {len(prompt)} tokens, longer than the"):
        episode.reset(state.state_id)


# -- templates that re-render earlier turns (Qwen3) -----------------------------------------


@pytest.fixture(scope="module")
def qwen3_policy(qwen3_model_dir):
    from bat_gym.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(qwen3_model_dir, device="cpu")
    yield policy
    policy.close()


def thinking(actions: list[str]) -> list[str]:
    """The actions as a thinking model writes them: reasoning first, then the action."""
    return [
        f"<think>\nStep {i}: decide the next call.\n</think>\n\n{a}" for i, a in enumerate(actions)
    ]


def assert_token_in_token_out(result, gen) -> None:
    """Each turn saw exactly the prompt, the sampled tokens and the replies before it."""
    sequence = result.prompt_ids + result.response_ids
    for context, turn in zip(gen.contexts, gen.turns, strict=False):
        assert sequence[: len(context)] == context
        assert sequence[len(context) : len(context) + len(turn)] == turn
    segments = runs(result.response_mask)
    assert [result.response_ids[a:b] for v, a, b in segments if v == 1] == gen.turns


def test_qwen3_thinking_agent_episodes_train_on_what_evaluation_renders(
    helpers, env, toy, toy_bank, qwen3_policy
):
    # One user message, then assistant and tool turns: Qwen3's template keeps the reasoning
    # of every turn after the last user query, so it is prefix-preserving here.
    tok = qwen3_policy.tokenizer
    state = state_of(toy_bank, "E2E")
    actions = thinking(helpers.script(toy, state, "teacher"))
    episode = TokenEpisode(env, tok)
    gen = Recorded(helpers.ScriptedTokens(tok, actions), episode)
    result = episode.run(gen, state_id=state.state_id)

    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    assert result.rerendered_replies == 0
    assert_token_in_token_out(result, gen.gen)
    for context, messages in zip(gen.gen.contexts, gen.conversations, strict=True):
        assert context == evaluation_prompt(qwen3_policy, messages, episode._tools)
    assert "<think>\nStep 0: decide the next call.\n</think>" in tok.decode(gen.gen.contexts[-1])


def test_qwen3_without_thinking_trains_on_the_sampled_context(
    helpers, env, toy, toy_bank, qwen3_policy, monkeypatch
):
    tok = qwen3_policy.tokenizer
    kwargs = {"enable_thinking": False}
    monkeypatch.setattr(qwen3_policy, "chat_template_kwargs", kwargs)
    state = state_of(toy_bank, "E2E")
    actions = helpers.script(toy, state, "teacher")
    episode = TokenEpisode(env, tok, chat_template_kwargs=kwargs)
    gen = Recorded(helpers.ScriptedTokens(tok, actions), episode)
    result = episode.run(gen, state_id=state.state_id)

    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    # Every reply follows an assistant turn the template re-renders without its empty
    # think block once it is no longer the last message.
    assert result.rerendered_replies == result.num_replies == len(actions) - 1
    assert_token_in_token_out(result, gen.gen)
    empty = tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert result.prompt_ids[-len(empty) :] == empty
    segments = runs(result.response_mask)
    for v, a, b in segments:
        if v == 0:
            reply = result.response_ids[a:b]
            assert tok.decode(reply).startswith("\n<|im_start|>user\n<tool_response>\n")
            assert reply[-len(empty) :] == empty
    # Evaluation renders the same conversation but for the empty think blocks before
    # earlier assistant turns, which the template drops (the documented limit).
    for context, messages in zip(gen.gen.contexts, gen.conversations, strict=True):
        evaluated = evaluation_prompt(qwen3_policy, messages, episode._tools)
        assert without_all_but_last(context, empty) == evaluated


def without_all_but_last(ids: list[int], part: list[int]) -> list[int]:
    """``ids`` with every occurrence of ``part`` removed but the last."""
    at = [i for i in range(len(ids) - len(part) + 1) if ids[i : i + len(part)] == part]
    drop = {i + k for i in at[:-1] for k in range(len(part))}
    return [t for i, t in enumerate(ids) if i not in drop]


def test_qwen3_reasoning_dropped_after_a_later_user_message_keeps_the_sampled_tokens(
    helpers, env, toy, toy_bank, qwen3_policy
):
    # bat_gym's tool-call error is a user message: Qwen3's template then drops the
    # reasoning of the assistant turns before it.
    tok = qwen3_policy.tokenizer
    state = state_of(toy_bank, "S3")
    actions = thinking(helpers.script(toy, state, "malformed"))
    episode = TokenEpisode(env, tok)
    gen = Recorded(helpers.ScriptedTokens(tok, actions), episode)
    result = episode.run(gen, state_id=state.state_id)
    assert result.stop_reason == "terminated" and result.rerendered_replies == 1
    assert_token_in_token_out(result, gen.gen)
    reply = tok.decode(result.response_ids[len(gen.gen.turns[0]) :])
    assert reply.startswith("\n<|im_start|>user\n[tool call error]")


def test_a_re_rendering_template_can_be_refused(helpers, env, toy, toy_bank, qwen3_policy):
    tok = qwen3_policy.tokenizer
    state = state_of(toy_bank, "S5")
    episode = TokenEpisode(
        env, tok, chat_template_kwargs={"enable_thinking": False}, rerendering="error"
    )
    gen = helpers.ScriptedTokens(tok, helpers.script(toy, state, "teacher"))
    with pytest.raises(ChatTemplateError, match="prefix-preserving"):
        episode.run(gen, state_id=state.state_id)


def test_a_template_whose_assistant_turns_have_no_stop_token_cannot_be_aligned(tiny_tokenizer):
    tok = tiny_tokenizer
    original = tok.chat_template
    # Earlier assistant turns lose their end-of-turn token once messages follow.
    tok.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') }}"
        "{%- if m['role'] != 'assistant' or loop.last %}{{ '<|im_end|>' }}{% endif %}"
        "{{ '\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    try:
        before = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ls"}]
        new = [{"role": "user", "content": "x"}]
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        with pytest.raises(ChatTemplateError, match="end of the assistant turn cannot be found"):
            reply_delta(tok, before, new, None, stop_token_ids={im_end})
    finally:
        tok.chat_template = original


def test_the_reply_after_a_re_rendered_turn_is_what_the_template_writes_after_it(
    tiny_tokenizer,
):
    tok = tiny_tokenizer
    original = tok.chat_template
    # Earlier user turns are abbreviated once an assistant turn follows them: the
    # count of end-of-turn tokens is kept, their content is not.
    tok.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{%- if m['role'] == 'user' and not loop.last and loop.index0 < messages|length - 2 %}"
        "{{ '...' }}{%- else %}{{ m['content'] }}{%- endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    try:
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        before = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "ls"}]
        new = [{"role": "user", "content": "a b"}]
        delta = reply_delta(tok, before, new, None, stop_token_ids={im_end})
        assert delta.rerendered
        assert tok.decode(delta.ids) == "\n<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n"
    finally:
        tok.chat_template = original
