"""GRPO rollouts: concurrent token-level episodes, trained on exactly what was sampled."""

import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from chat_templates import qwen_tokenizer  # noqa: E402
from corpus import project_text

from bat_gym.core.errors import EnvLost  # noqa: E402
from bat_gym.core.protocol import get_protocol  # noqa: E402
from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.policies import EpisodeContext, PolicyRequest, make_policy  # noqa: E402
from bat_gym.policies.local import TokenGeneration  # noqa: E402
from bat_gym.rubrics.verifier.reward import RubricReward  # noqa: E402
from bat_gym.trainers.rollout import LOST_ENV_ATTEMPTS, RolloutWorkers  # noqa: E402
from bat_gym.trainers.tiny_model import build_tokenizer  # noqa: E402

HERMES = get_protocol("hermes")
# Room for the longest teacher turn with this small vocabulary (about 520 tokens): the
# workers cut a turn to the tokens it was asked for, as a real sampler does.
TEACHER_TURN_TOKENS = 1024


@pytest.fixture(scope="module")
def tokenizer(toy_bank, tmp_path_factory):
    texts = [m.get("content") or "" for i in toy_bank.select() for m in toy_bank.get(i).messages]
    texts += project_text()
    return build_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=700)


class TeacherTokens:
    """A batch generator that emits each episode's next teacher turn, recording prompts."""

    def __init__(self, toy, toy_bank, tokenizer, end: str | None = None) -> None:
        self.toy, self.bank, self.tokenizer = toy, toy_bank, tokenizer
        # The token each turn ends with (default: the eos), and that closes each turn.
        self.end = tokenizer.eos_token_id if end is None else tokenizer.convert_tokens_to_ids(end)
        self.prompts: list[list[int]] = []
        self.batches: list[int] = []
        self.sampled: list[list[int]] = []
        self.turn_of: dict[tuple[int, ...], int] = {}
        self.lock = threading.Lock()

    def turns(self, state_id):
        state = self.bank.get(state_id)
        ctx = EpisodeContext(benchmark=self.toy, state=state, turn=0)
        return make_policy("teacher")._turns(PolicyRequest([], [], ctx))

    def __call__(self, prompts, max_new_tokens):
        out = []
        with self.lock:
            self.batches.append(len(prompts))
            for prompt in prompts:
                self.prompts.append(list(prompt))
                # Each earlier turn left two end-of-turn tokens: its own and its reply's.
                k = (prompt.count(self.end) - self.prompt_turns) // 2
                turn = self.script[k]
                ids = self.tokenizer.encode(HERMES.render(turn.content, list(turn.calls)))
                ids = ids + [self.end]
                self.sampled.append(ids)
                out.append(TokenGeneration(ids, [-0.25] * len(ids), "stop"))
        return out


def make_env(toy, toy_bank):
    return RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank))


def test_every_turn_is_trained_on_exactly_the_ids_that_were_sampled(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="E2E")[0]
    gen = TeacherTokens(toy, toy_bank, tokenizer)
    gen.script = gen.turns(state_id)
    # The prompt's own end-of-turn tokens (system, user) precede the first turn.
    workers = RolloutWorkers(
        lambda: make_env(toy, toy_bank), gen, tokenizer, max_new_tokens=TEACHER_TURN_TOKENS
    )
    env = make_env(toy, toy_bank)
    _, info = env.reset(options={"state_id": state_id})
    env.close()
    from bat_gym.rollout.chat_tokens import render_ids

    prompt = render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)
    gen.prompt_turns = prompt.count(tokenizer.eos_token_id)
    try:
        (result,) = workers.play([state_id])
    finally:
        workers.close()
    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    sequence = result.prompt_ids + result.response_ids
    for seen in gen.prompts:  # every turn was conditioned on a prefix of the sequence
        assert sequence[: len(seen)] == seen
    sampled = [t for t, m in zip(result.response_ids, result.response_mask, strict=True) if m]
    assert sampled == [t for s in gen.sampled for t in s]
    assert result.response_logprobs.count(-0.25) == len(sampled)


def test_group_episodes_meet_in_one_generation_batch(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="S1")[0]
    gen = TeacherTokens(toy, toy_bank, tokenizer)
    gen.script = gen.turns(state_id)
    env = make_env(toy, toy_bank)
    _, info = env.reset(options={"state_id": state_id})
    env.close()
    from bat_gym.rollout.chat_tokens import render_ids

    prompt = render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)
    gen.prompt_turns = prompt.count(tokenizer.eos_token_id)
    built = []

    def build():
        built.append(make_env(toy, toy_bank))
        return built[-1]

    workers = RolloutWorkers(
        build, gen, tokenizer, max_new_tokens=TEACHER_TURN_TOKENS, num_envs=4, wait_s=0.05
    )
    try:
        results = workers.play([state_id] * 4)
    finally:
        workers.close()
    assert [r.state_id for r in results] == [state_id] * 4
    assert all(r.reward == pytest.approx(1.0) for r in results)
    assert max(gen.batches) > 1  # concurrent episodes were decoded together
    assert len(built) <= 4


def prompt_ids(toy, toy_bank, tokenizer, state_id):
    """The rendered prompt of ``state_id``."""
    from bat_gym.rollout.chat_tokens import render_ids

    env = make_env(toy, toy_bank)
    _, info = env.reset(options={"state_id": state_id})
    env.close()
    return render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)


def test_episodes_stop_where_the_sampler_stops(toy, toy_bank, tokenizer, tmp_path):
    # A Qwen base tokenizer: the eos is <|endoftext|>, a chat turn ends in <|im_end|>.
    tok = qwen_tokenizer(tokenizer.name_or_path, tmp_path / "tok")
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    state_id = toy_bank.select(focus="E2E")[0]
    gen = TeacherTokens(toy, toy_bank, tok, end="<|im_end|>")
    gen.script = gen.turns(state_id)
    gen.prompt_turns = prompt_ids(toy, toy_bank, tok, state_id).count(im_end)
    # The sampler's stop ids, as GRPO passes them (policy.stop_token_ids).
    workers = RolloutWorkers(
        lambda: make_env(toy, toy_bank),
        gen,
        tok,
        max_new_tokens=TEACHER_TURN_TOKENS,
        stop_token_ids=[endoftext, im_end],
    )
    try:
        (result,) = workers.play([state_id])
    finally:
        workers.close()
    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    assert result.num_turns == len(gen.script)
    sequence = result.prompt_ids + result.response_ids
    assert endoftext not in sequence
    for seen in gen.prompts:
        assert sequence[: len(seen)] == seen
        assert "<|im_end|><|im_end|>" not in tok.decode(seen)


class Rambling:
    """A sampler that never stops: every turn is ``n`` tokens of text, no stop token."""

    def __init__(self, tokenizer) -> None:
        self.word = tokenizer.encode(" data", add_special_tokens=False)[0]
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, prompts, max_new_tokens):
        self.calls.append(([len(p) for p in prompts], max_new_tokens))
        return [TokenGeneration([self.word] * max_new_tokens, [-1.0] * max_new_tokens, "length")]


def test_a_cut_turn_ends_the_episode_unplayed(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="E2E")[0]
    gen = Rambling(tokenizer)
    workers = RolloutWorkers(lambda: make_env(toy, toy_bank), gen, tokenizer, max_new_tokens=9)
    try:
        (result,) = workers.play([state_id])
    finally:
        workers.close()
    assert result.stop_reason == "length" and result.length_limit == "turn"
    assert result.num_turns == 1 and result.response_ids == [gen.word] * 9
    assert result.info["turns"] == 0  # the env never ran the unfinished message


def test_the_total_cap_bounds_each_turn_and_ends_the_episode(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="E2E")[0]
    length = len(prompt_ids(toy, toy_bank, tokenizer, state_id))
    gen = Rambling(tokenizer)
    workers = RolloutWorkers(
        lambda: make_env(toy, toy_bank),
        gen,
        tokenizer,
        max_new_tokens=64,
        max_total_tokens=length + 5,
        cut_turn="act",
    )
    try:
        (result,) = workers.play([state_id])
    finally:
        workers.close()
    assert result.stop_reason == "length" and result.length_limit == "total"
    assert len(result.prompt_ids) + len(result.response_ids) == length + 5
    assert gen.calls == [([length], 5)]  # asked for what fits, not max_new_tokens


def test_a_batch_is_sampled_at_its_largest_cap_and_each_turn_cut_to_its_own(tokenizer):
    calls = []

    def batch(prompts, n):
        calls.append(n)
        return [TokenGeneration([7] * n, [-1.0] * n, "length") for _ in prompts]

    workers = RolloutWorkers(lambda: None, batch, tokenizer, max_new_tokens=16)
    try:
        out = workers._generate([([1, 2], 3, None), ([1], 10, None)])
    finally:
        workers.close()
    assert calls == [10]
    assert [len(g.token_ids) for g in out] == [3, 10]
    assert out[0].finish_reason == "length" and len(out[0].logprobs) == 3


class LosesItself:
    """An env whose first ``losses`` steps fail as if its Ray actor had died."""

    def __init__(self, env, losses: int) -> None:
        self.env, self.losses = env, losses

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        if self.losses:
            self.losses -= 1
            raise EnvLost("env 0's actor died during step")
        return self.env.step(action)


@pytest.mark.parametrize("losses", [1, LOST_ENV_ATTEMPTS - 1])
def test_an_episode_whose_env_is_lost_is_played_again_from_its_start(
    toy, toy_bank, tokenizer, losses
):
    state_id = toy_bank.select(focus="E2E")[0]
    gen = TeacherTokens(toy, toy_bank, tokenizer)
    gen.script = gen.turns(state_id)
    env = make_env(toy, toy_bank)
    _, info = env.reset(options={"state_id": state_id})
    from bat_gym.rollout.chat_tokens import render_ids

    prompt = render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)
    gen.prompt_turns = prompt.count(tokenizer.eos_token_id)
    workers = RolloutWorkers(
        lambda: LosesItself(env, losses), gen, tokenizer, max_new_tokens=TEACHER_TURN_TOKENS
    )
    try:
        (result,) = workers.play([state_id])
    finally:
        workers.close()
    # Scored as the whole episode it was, not as a failure; the lost turns are gone.
    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    assert result.num_turns == len(gen.script)


def test_an_env_lost_on_every_attempt_fails_the_rollouts(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="E2E")[0]
    gen = TeacherTokens(toy, toy_bank, tokenizer)
    gen.script = gen.turns(state_id)
    gen.prompt_turns = 0
    workers = RolloutWorkers(
        lambda: LosesItself(make_env(toy, toy_bank), LOST_ENV_ATTEMPTS),
        gen,
        tokenizer,
        max_new_tokens=TEACHER_TURN_TOKENS,
    )
    try:
        with pytest.raises(EnvLost):
            workers.play([state_id])
    finally:
        workers.close()


def test_keyed_episodes_draw_the_same_tokens_however_their_turns_interleave(toy, toy_bank, tiny):
    from bat_gym.core.spec import Budgets
    from bat_gym.policies.transformers_policy import TransformersPolicy

    state_id = toy_bank.select(focus="S1")[0]
    keys = [("test", i) for i in range(4)]

    def play(num_envs, seed_keys):
        pol = TransformersPolicy(tiny, temperature=1.0, max_new_tokens=6, seed=5)
        workers = RolloutWorkers(
            lambda: RubricReward(
                StageEnv("E2E", benchmark=toy, states=toy_bank, budgets=Budgets(max_turns=3))
            ),
            lambda p, n, **kw: pol.generate_tokens(p, max_new_tokens=n, **kw),
            pol.tokenizer,
            max_new_tokens=6,
            num_envs=num_envs,
            stop_token_ids=sorted(pol.stop_token_ids),
            cut_turn="act",  # three turns each: episodes interleave turn by turn
        )
        try:
            return [r.response_ids for r in workers.play([state_id] * 4, seed_keys)]
        finally:
            workers.close()
            pol.close()

    one_at_a_time = play(1, keys)
    assert play(4, keys) == one_at_a_time
    assert len({tuple(ids) for ids in one_at_a_time}) == 4  # a seed per episode and turn
    # The keys are what holds it: the policy's arrival-order sequence gives other draws.
    assert play(4, None) != one_at_a_time
    with pytest.raises(ValueError, match="3 seed keys for 4 episodes"):
        play(1, keys[:3])
