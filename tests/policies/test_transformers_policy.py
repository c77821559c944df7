"""TransformersPolicy on a tiny Qwen3-style model built on the spot (nothing downloaded)."""

import shutil
import threading
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.core.protocol import TOOLS, HermesProtocol  # noqa: E402
from bat_gym.policies import PolicyRequest, make_policy  # noqa: E402
from bat_gym.policies.local import chat_messages, checkpoint_digest  # noqa: E402
from bat_gym.policies.transformers_policy import TransformersPolicy  # noqa: E402

CORPUS = [
    HermesProtocol.example,
    "Run the pipeline, check the output, then call finish with a summary.",
    "ls /workspace; cat data/cases.csv; python3 train.py --epochs 3",
    '{"type": "function", "function": {"name": "execute_code", "parameters": {}}}',
    "You are a careful engineer. Validate the model and submit predictions.",
] * 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from bat_gym.trainers.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny") / "tiny-qwen"
    return build_tiny_model(out, CORPUS, vocab_size=512, hidden_size=128, num_layers=2)


@pytest.fixture(scope="module")
def policy(model_dir):
    pol = make_policy(f"hf:{model_dir}", temperature=1.0, max_new_tokens=12, seed=7)
    yield pol
    pol.close()


def request(text, history=()):
    messages = [{"role": "system", "content": "Work in the sandbox."}, *history]
    messages.append({"role": "user", "content": text})
    return PolicyRequest(messages=messages, tools=list(TOOLS))


REQUESTS = [
    request("List the files."),
    request("Train the model, then evaluate it on the held-out cases please."),
    request(
        "Continue.",
        history=[
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {
                            "name": "execute_code",
                            "arguments": '{"language": "bash", "code": "ls"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "name": "execute_code", "content": "a b"},
        ],
    ),
]


def test_make_policy_builds_it_from_an_hf_spec(policy, model_dir):
    assert isinstance(policy, TransformersPolicy)
    assert policy.name == f"hf:{model_dir.name}" and policy.device.type == "cpu"


def test_a_batch_of_three_gives_three_outputs_with_tokens_and_logprobs(policy):
    outs = policy.act_batch(REQUESTS)
    assert len(outs) == 3
    lengths = {len(o.prompt_token_ids) for o in outs}
    assert len(lengths) == 3  # different prompt lengths: left padding is exercised
    for req, out in zip(REQUESTS, outs, strict=True):
        assert out.prompt_token_ids == policy.prompt_token_ids(req)
        assert 1 <= len(out.token_ids) <= 12 and len(out.logprobs) == len(out.token_ids)
        assert all(lp <= 0 for lp in out.logprobs)
        assert out.finish_reason in ("stop", "length")
        assert out.num_tokens == len(out.token_ids) == out.usage["completion_tokens"]
        shown = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
        assert policy.tokenizer.decode(shown, skip_special_tokens=True) == out.text
        assert out.action() == out.text and out.action().num_tokens == len(out.token_ids)


def test_the_prompt_is_the_chat_template_with_tools_and_parsed_arguments(policy):
    text = policy.tokenizer.decode(policy.prompt_token_ids(REQUESTS[2]))
    assert "# Tools" in text and '"name": "execute_code"' in text
    # OpenAI string arguments reach the template as an object, written once, not re-quoted.
    assert '"arguments": {"language": "bash", "code": "ls"}' in text
    assert text.endswith("<|im_start|>assistant\n")
    assert chat_messages(
        [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{bad"}}]}]
    ) == [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{bad"}}]}]


def test_chat_template_kwargs_render_every_prompt_and_name_the_policy(model_dir, monkeypatch):
    pol = make_policy(f"hf:{model_dir}", chat_template_kwargs={"enable_thinking": False})
    try:
        # A template with Qwen3's thinking switch: an empty think block when it is off.
        switch = (
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
        )
        monkeypatch.setattr(pol.tokenizer, "chat_template", pol.tokenizer.chat_template + switch)
        text = pol.tokenizer.decode(pol.prompt_token_ids(REQUESTS[0]))
        assert text.endswith("<|im_start|>assistant\n<think></think>")
        assert pol.identity()["chat_template_kwargs"] == {"enable_thinking": False}
    finally:
        pol.close()


def test_logprobs_are_the_temperature_scaled_model_logprobs(policy):
    prompt = policy.prompt_token_ids(REQUESTS[0])
    (gen,) = policy.generate_tokens([prompt], temperature=0.5, max_new_tokens=6, seeds=[3])
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits / 0.5, dim=-1).gather(
        -1, torch.tensor(gen.token_ids)[:, None]
    )
    assert torch.allclose(expected.squeeze(-1), torch.tensor(gen.logprobs), atol=1e-4)


def test_a_seed_makes_sampling_reproducible_and_independent_of_batching(model_dir):
    def run(batched):
        pol = TransformersPolicy(model_dir, temperature=1.0, max_new_tokens=8, seed=123)
        try:
            if batched:
                return [o.token_ids for o in pol.act_batch(REQUESTS)]
            return [pol.act_batch([r])[0].token_ids for r in REQUESTS]
        finally:
            pol.close()

    first = run(batched=True)
    assert run(batched=True) == first
    assert run(batched=False) == first
    # The n-th request gets its own seed: identical prompts still sample differently.
    pol = TransformersPolicy(model_dir, temperature=1.0, max_new_tokens=8, seed=123)
    outs = pol.act_batch([REQUESTS[0]] * 4)
    pol.close()
    assert len({tuple(o.token_ids) for o in outs}) > 1


def test_a_keyed_request_samples_the_same_whatever_arrives_with_it(model_dir):
    keyed = [replace(r, seed_key=("episode", i, 0)) for i, r in enumerate(REQUESTS)]
    pol = TransformersPolicy(model_dir, temperature=1.0, max_new_tokens=8, seed=123)
    try:
        first = [o.token_ids for o in pol.act_batch(keyed)]
        # Reversed, one at a time, and after unkeyed requests that advance the sequence:
        pol.act_batch(REQUESTS)
        backwards = [pol.act_batch([r])[0].token_ids for r in reversed(keyed)][::-1]
        mixed = pol.act_batch([REQUESTS[0], keyed[1], REQUESTS[2], keyed[0]])
        same_prompt = pol.act_batch(
            [replace(keyed[0], seed_key=("episode", i, 0)) for i in range(4)]
        )
    finally:
        pol.close()
    assert backwards == first
    assert [mixed[1].token_ids, mixed[3].token_ids] == [first[1], first[0]]
    # Another key is another seed, even for the same prompt.
    assert len({tuple(o.token_ids) for o in same_prompt}) > 1
    # Keyed requests leave the sequence alone: unkeyed ones draw as if they were not there.
    assert pol.sampling_state() == {"requests_seeded": len(REQUESTS) + 2}


def test_keyed_seeds_are_stable_spread_and_refuse_strays():
    from bat_gym.policies import keyed_seed

    np = pytest.importorskip("numpy")
    seed = keyed_seed(7, ("cell", "segmentation", 1042, 0, 3))
    assert seed == keyed_seed(7, ("cell", "segmentation", np.int64(1042), 0, 3))
    assert 0 <= seed < 2**63
    near = {keyed_seed(7, ("cell", "t", 1, 0, turn)) for turn in range(1000)}
    assert len(near) == 1000 and keyed_seed(8, ("cell", "t", 1, 0, 0)) not in near
    with pytest.raises(TypeError):
        keyed_seed(7, ("cell", 1.5))


def test_concurrent_act_calls_are_batched_and_match_sequential_results(policy, monkeypatch):
    expected = [
        policy.generate_tokens([policy.prompt_token_ids(r)], temperature=0)[0] for r in REQUESTS
    ]
    calls = []
    real = policy.generate_tokens

    def counting(prompts, **kwargs):
        calls.append(len(prompts))
        return real(prompts, temperature=0, **kwargs)

    monkeypatch.setattr(policy, "generate_tokens", counting)
    monkeypatch.setattr(policy.batcher, "wait_s", 0.5)
    reqs = [*REQUESTS, REQUESTS[0]]
    results = [None] * len(reqs)
    barrier = threading.Barrier(len(reqs))

    def worker(i):
        barrier.wait()
        results[i] = policy.act(reqs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(calls) == 4 and len(calls) < 4
    for out, exp in zip(results, [*expected, expected[0]], strict=True):
        assert out.token_ids == exp.token_ids
        assert out.logprobs == pytest.approx(exp.logprobs, abs=1e-4)


def test_generate_tokens_continues_from_given_ids(policy):
    prompt = policy.prompt_token_ids(REQUESTS[0])
    (first,) = policy.generate_tokens([prompt], temperature=0, max_new_tokens=6)
    (whole,) = policy.generate_tokens([prompt], temperature=0, max_new_tokens=3)
    (rest,) = policy.generate_tokens([prompt + whole.token_ids], temperature=0, max_new_tokens=3)
    assert whole.token_ids + rest.token_ids == first.token_ids
    assert whole.logprobs + rest.logprobs == pytest.approx(first.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="at least one token"):
        policy.generate_tokens([[]])


def test_sampling_runs_in_eval_mode_and_leaves_a_training_model_training(policy):
    policy.model.train()
    try:
        modes = []
        hook = policy.model.register_forward_pre_hook(lambda m, a: modes.append(m.training))
        policy.generate_tokens([[1, 2, 3]], max_new_tokens=2)
        hook.remove()
        assert modes and not any(modes) and policy.model.training
    finally:
        policy.model.eval()


def test_max_new_tokens_is_respected_with_finish_reason_length(policy):
    gens = policy.generate_tokens([policy.prompt_token_ids(r) for r in REQUESTS], max_new_tokens=5)
    assert [len(g.token_ids) for g in gens] == [5, 5, 5]
    assert {g.finish_reason for g in gens} == {"length"}


def test_a_stop_token_ends_the_reply_and_stays_out_of_the_text(policy, monkeypatch):
    prompt = policy.prompt_token_ids(REQUESTS[0])
    (greedy,) = policy.generate_tokens([prompt], temperature=0, max_new_tokens=4)
    first = greedy.token_ids[0]
    monkeypatch.setattr(policy, "stop_token_ids", frozenset({first}))
    monkeypatch.setattr(policy, "temperature", 0.0)
    out = policy.act_batch([REQUESTS[0]])[0]
    assert out.token_ids == [first] and out.finish_reason == "stop" and out.text == ""


def test_identity_digest_changes_when_the_weights_change(policy, model_dir, tmp_path):
    ident = policy.identity()
    assert ident["kind"] == "transformers" and ident["sha256"] == checkpoint_digest(model_dir)
    assert "chat_template_kwargs" not in ident  # only when set: older runs still resume
    assert ident["temperature"] == 1.0 and ident["max_new_tokens"] == 12 and ident["seed"] == 7
    changed = tmp_path / "changed"
    shutil.copytree(model_dir, changed)
    assert checkpoint_digest(changed) == ident["sha256"]  # the name of the folder is not hashed
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(changed)
    with torch.no_grad():
        model.model.norm.weight.add_(0.01)
    model.save_pretrained(changed)
    assert checkpoint_digest(changed) != ident["sha256"]


def test_bad_settings_fail_before_loading(model_dir):
    with pytest.raises(ValueError, match="temperature"):
        TransformersPolicy(model_dir, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        TransformersPolicy(model_dir, top_p=0)
    from bat_gym.core.errors import ModelNotFound

    with pytest.raises(ModelNotFound, match="bat-gym tiny-model DIR"):
        TransformersPolicy(model_dir / "missing")
