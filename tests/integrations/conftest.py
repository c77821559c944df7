"""Fixtures for the trainer adapters: a tiny local tokenizer/model and scripted turns."""

from __future__ import annotations

import pytest

from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.policies import EpisodeContext, PolicyRequest, ScriptedPolicy


def _corpus(bench, bank) -> list[str]:
    texts = []
    for state_id in bank.select():
        state = bank.get(state_id)
        texts += [str(m.get("content") or "") for m in state.messages]
        texts += teacher_actions(bench, state)
    return texts


@pytest.fixture(scope="session")
def tiny_tokenizer(toy, toy_bank, tmp_path_factory):
    pytest.importorskip("transformers")
    from bat_gym.trainers.tiny_model import build_tokenizer

    return build_tokenizer(_corpus(toy, toy_bank), tmp_path_factory.mktemp("tok"), vocab_size=1024)


@pytest.fixture(scope="session")
def tiny_model_dir(toy, toy_bank, tmp_path_factory):
    pytest.importorskip("torch")
    from bat_gym.trainers.tiny_model import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny"),
        _corpus(toy, toy_bank),
        vocab_size=1024,
        hidden_size=64,
        num_layers=2,
        num_heads=1,
        max_position_embeddings=4096,
    )


@pytest.fixture(scope="session")
def endoftext_model_dir(toy, toy_bank, tmp_path_factory):
    """A tiny model whose tokenizer is Qwen2.5-base-like: ChatML turns end in <|im_end|>, but
    its eos is <|endoftext|>."""
    pytest.importorskip("torch")
    from chat_templates import CHATML, qwen_model

    return qwen_model(tmp_path_factory.mktemp("eot"), _corpus(toy, toy_bank), template=CHATML)


@pytest.fixture(scope="session")
def qwen3_model_dir(toy, toy_bank, tmp_path_factory):
    """A tiny model with a Qwen3-style thinking template (eos <|im_end|>, as Qwen3's)."""
    pytest.importorskip("torch")
    from chat_templates import QWEN3, qwen_model

    return qwen_model(
        tmp_path_factory.mktemp("qwen3"), _corpus(toy, toy_bank), eos="<|im_end|>", template=QWEN3
    )


def teacher_actions(bench, state) -> list[str]:
    """The teacher's turns from ``state`` to its ``finish``, written as Hermes messages."""
    policy = ScriptedPolicy("teacher", protocol="hermes")
    actions = []
    for turn in range(64):
        text = policy.act(PolicyRequest([], [], EpisodeContext(bench, state, turn))).text
        actions.append(text)
        if any(c.name == "finish" for c in get_protocol("hermes").parse(text).calls):
            return actions
    raise AssertionError("the teacher never finishes")


def script(bench, state, kind: str) -> list[str]:
    """Action sequences: the whole teacher script, a malformed turn then ``finish``, or
    ``finish`` at once."""
    finish = get_protocol("hermes").render(
        "Done.", [ToolCall(name="finish", arguments={"summary": "stopping"})]
    )
    if kind == "teacher":
        return teacher_actions(bench, state)
    if kind == "malformed":
        return ['<tool_call>{"name": "execute_code", "arguments": </tool_call>', finish]
    if kind == "finish":
        return [finish]
    raise ValueError(kind)


class ScriptedTokens:
    """A generator that samples a fixed script: each call returns the next action's tokens
    followed by the end-of-turn token (default: the tokenizer's eos)."""

    def __init__(self, tokenizer, actions: list[str], end: str | None = None) -> None:
        stop = tokenizer.eos_token_id if end is None else tokenizer.convert_tokens_to_ids(end)
        self.turns = [tokenizer.encode(a, add_special_tokens=False) + [stop] for a in actions]
        self.contexts: list[list[int]] = []

    def __call__(self, context_ids, max_new_tokens=None):
        self.contexts.append(list(context_ids))
        return list(self.turns[len(self.contexts) - 1])


class RoutedBatch:
    """A batch generator over per-rollout :class:`ScriptedTokens`: each context goes to the
    unfinished script whose own history it extends (the first free one on ties, which is
    the rollout order)."""

    def __init__(self, gens: list[ScriptedTokens], prompts: list[list[int]]) -> None:
        self.gens, self.prompts = gens, prompts
        self.max_new: list[list[int | None]] = []

    def __call__(self, contexts, max_new):
        self.max_new.append(list(max_new))
        taken, out = set(), []
        for context in contexts:
            for i, gen in enumerate(self.gens):
                done = len(gen.contexts)
                if i in taken or done >= len(gen.turns):
                    continue
                expected = gen.contexts[-1] + gen.turns[done - 1] if done else self.prompts[i]
                if context[: len(expected)] == expected:
                    taken.add(i)
                    out.append(gen(context))
                    break
            else:
                raise AssertionError("a context matches no scripted rollout")
        return out


def play_in_process(bench, bank, state_id, calls, **budgets):
    """Play ``calls`` one per step in the in-process env (RubricReward around StageEnv, the
    benchmark's budgets with ``budgets`` applied); the last step's (reward, info)."""
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.verifier.reward import RubricReward

    hermes = get_protocol("hermes")
    env = RubricReward(
        StageEnv(
            benchmark=bench, states=bank, budgets=bench.spec.budgets.model_copy(update=budgets)
        )
    )
    try:
        env.reset(options={"state_id": state_id})
        for call in calls:
            _, reward, terminated, truncated, info = env.step(hermes.render("", [call]))
            if terminated or truncated:
                return reward, info
        raise AssertionError("the episode did not end")
    finally:
        env.close()


def tiny_grpo_config(output_dir, *, max_steps: int, max_completion_length: int):
    """TRL's GRPOConfig for a few CPU steps of a tiny random model, two rollouts a group."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=max_completion_length,
        learning_rate=1e-3,
        beta=0.0,
        # A random model scores the same in every rollout, so GRPO's advantages are 0;
        # the entropy bonus still sends a gradient through the sampled tokens.
        entropy_coef=0.01,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )


def fake_trl_trainer(rollout, rows, tokenizer, *, max_completion_length=4096):
    """What BatRollout reads from TRL's GRPOTrainer, after TRL reset one environment per row."""
    from types import SimpleNamespace

    environments = [rollout.environment_factory() for _ in rows]
    for environment, row in zip(environments, rows, strict=True):
        environment.reset(**row)
    return SimpleNamespace(
        environments=environments,
        processing_class=tokenizer,
        max_completion_length=max_completion_length,
        eos_token_ids=[tokenizer.eos_token_id],
        chat_template_kwargs={},
    )


@pytest.fixture(scope="session")
def in_process():
    """:func:`play_in_process`: the native env's (reward, info) for the same calls."""
    return play_in_process


@pytest.fixture
def verl_loop(monkeypatch):
    """``(BatAgentLoop, AgentLoopOutput)``: on verl's real base classes when verl imports,
    else on a small stand-in of ``verl.experimental.agent_loop.agent_loop`` with the same
    constructor, ``run`` signature and output model."""
    import importlib.util
    import sys
    import types

    import bat_gym.integrations.verl as bat_verl

    monkeypatch.setattr(bat_verl, "_built", {})
    try:
        real = importlib.util.find_spec("verl.experimental.agent_loop.agent_loop") is not None
    except ModuleNotFoundError:
        real = False
    if real:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

        return bat_verl.BatAgentLoop, AgentLoopOutput, True

    from pydantic import BaseModel

    class AgentLoopMetrics(BaseModel):
        generate_sequences: float = 0.0
        tool_calls: float = 0.0

    class AgentLoopOutput(BaseModel):
        prompt_ids: list[int]
        response_ids: list[int]
        response_mask: list[int]
        response_logprobs: list[float] | None = None
        multi_modal_data: dict | None = None
        reward_score: float | None = None
        num_turns: int = 0
        metrics: AgentLoopMetrics
        extra_fields: dict = {}

    class AgentLoopBase:
        def __init__(self, trainer_config, server_manager, tokenizer, processor, **kwargs):
            self.config = trainer_config.config
            self.server_manager = server_manager
            self.tokenizer = tokenizer
            self.processor = processor

        async def run(self, sampling_params, **kwargs):
            raise NotImplementedError

    module = types.ModuleType("verl.experimental.agent_loop.agent_loop")
    module.AgentLoopBase = AgentLoopBase
    module.AgentLoopMetrics = AgentLoopMetrics
    module.AgentLoopOutput = AgentLoopOutput
    for name in ("verl", "verl.experimental", "verl.experimental.agent_loop"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return bat_verl.BatAgentLoop, AgentLoopOutput, False


class ScriptedServer:
    """verl's server manager, answering each ``generate`` from a scripted generator."""

    def __init__(self, gen) -> None:
        self.gen = gen
        self.calls: list[tuple[str, dict]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **_):
        from types import SimpleNamespace

        self.calls.append((request_id, dict(sampling_params)))
        tokens = self.gen(prompt_ids)
        return SimpleNamespace(token_ids=tokens, log_probs=[-0.25] * len(tokens))


def verl_trainer_config(response_length: int = 4096):
    """The slice of verl's trainer config the agent loop reads, in verl's wrapper."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"response_length": response_length, "prompt_length": 8192}
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    return SimpleNamespace(config=cfg)


def make_verl_loop(cls, real, trainer_config, server, tokenizer, **kwargs):
    """Instantiate the agent loop as verl's worker does: its base's arguments, then the
    agent loop config's entries."""
    import inspect
    from types import SimpleNamespace

    extra = {}
    if real:  # newer verl bases also take the dataset class and config
        params = inspect.signature(cls.__mro__[1].__init__).parameters
        if "dataset_cls" in params:
            from verl.utils.dataset.rl_dataset import RLHFDataset

            extra["dataset_cls"] = RLHFDataset
        for name in ("dataset_config", "data_config"):  # renamed in verl 0.9
            if name in params:
                extra[name] = SimpleNamespace(config=trainer_config.config.data)
    return cls(trainer_config, server, tokenizer, None, **extra, **kwargs)


class Helpers:
    """The helpers above, handed to tests as the ``helpers`` fixture."""

    script = staticmethod(script)
    teacher_actions = staticmethod(teacher_actions)
    ScriptedTokens = ScriptedTokens
    RoutedBatch = RoutedBatch
    fake_trl_trainer = staticmethod(fake_trl_trainer)
    play_in_process = staticmethod(play_in_process)
    tiny_grpo_config = staticmethod(tiny_grpo_config)
    ScriptedServer = ScriptedServer
    verl_trainer_config = staticmethod(verl_trainer_config)
    make_verl_loop = staticmethod(make_verl_loop)


@pytest.fixture(scope="session")
def helpers() -> type[Helpers]:
    return Helpers
