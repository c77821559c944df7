import json

import corpus
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from bat_gym.core.protocol import TOOLS, get_protocol  # noqa: E402
from bat_gym.sft import (  # noqa: E402
    IGNORE_INDEX,
    SFTRejected,
    SFTRenderError,
    chat_messages,
    export_sft,
    render_rows,
    render_sft,
    sft_rows,
    split_rows,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, with tool messages as their own role and assistant tool_calls in Hermes syntax.
CHATML = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] %}{{ message['content'] }}{% endif %}"
    "{%- if message.tool_calls is defined %}{% for tc in message.tool_calls %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n' }}{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}"
    "{{ '\\n</tool_call>' }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    code = sorted((corpus.ROOT / "bat_gym").glob("*.py"))
    lines = [line for path in code for line in path.read_text().splitlines()]
    lines += corpus.project_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines[:800], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    fast.chat_template = CHATML
    out = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(out)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def rows(toy, toy_bank):
    return sft_rows(toy_bank, toy)


def test_one_row_per_teacher_turn_with_one_target(toy, toy_bank, rows):
    e2e = toy_bank.select(focus="E2E")
    assert {r.source_state_id for r in rows} == set(e2e)
    for state_id in e2e:
        state = toy_bank.get(state_id)
        turns = toy.teacher_turns(toy.make_task(state.track, state.provenance["seed"], "train"))
        mine = [r for r in rows if r.source_state_id == state_id]
        assert [(r.target.content, r.target.calls) for r in mine] == [
            (t.content, t.calls) for t in turns
        ]
        assert [r.stage for r in mine] == [t.stage for t in turns]
    for r in rows:
        assert r.context[:2] == toy_bank.get(r.source_state_id).messages
        assert r.context[-1]["role"] in ("user", "tool")  # the target answers the last message
        assert sum(m["role"] == "assistant" for m in r.context) == r.turn
        dumped = r.model_dump()
        assert set(dumped["target"]) == {"content", "calls"}
    later = next(r for r in rows if r.turn == 2)
    assert any(m["role"] == "tool" and "exit code" in m["content"] for m in later.context)


@pytest.mark.parametrize("protocol", ["hermes", None])
def test_loss_is_on_the_target_action_only(rows, tokenizer, protocol):
    hermes = get_protocol("hermes")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row in rows[:8]:
        enc = render_sft(row, tokenizer, 100_000, protocol)
        ids, labels = enc["input_ids"], enc["labels"]
        assert len(ids) == len(labels) == len(enc["attention_mask"])
        trained = [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE_INDEX]
        # One contiguous span, at the end (only the template's trailing newline after
        # it), that ends on the end-of-turn token.
        first = next(i for i, lab in enumerate(labels) if lab != IGNORE_INDEX)
        assert labels[first : first + len(trained)] == trained and trained[-1] == end
        assert not tokenizer.decode(ids[first + len(trained) :]).strip()
        text = tokenizer.decode(trained, skip_special_tokens=True)
        target = hermes.render(row.target.content, list(row.target.calls))
        if protocol is None:
            assert text.startswith(row.target.content)
            for c in row.target.calls:
                assert f'"name": "{c.name}"' in text
                assert json.loads(text[text.index("{") : text.rindex("}") + 1])["name"] == c.name
        else:
            assert text == target
        assert "<tool_call>" in text
        # Everything before the span is exactly the prompt, masked.
        context, _ = chat_messages(row, protocol)
        prompt = tokenizer.apply_chat_template(context, add_generation_prompt=True, tokenize=False)
        assert tokenizer.decode(ids[:first]) == prompt
        assert set(labels[:first]) == {IGNORE_INDEX}


def test_an_over_long_row_is_rejected_not_clipped(rows, tokenizer):
    row = rows[-1]
    n = len(render_sft(row, tokenizer, 100_000)["input_ids"])
    assert len(render_sft(row, tokenizer, n)["input_ids"]) == n
    with pytest.raises(SFTRejected, match="too_long") as info:
        render_sft(row, tokenizer, n - 1)
    assert info.value.rejection.row_id == row.row_id
    kept, rejected = render_rows([rows[0], row], tokenizer, n - 1)
    assert [r.row_id for r, _ in kept] == [rows[0].row_id]
    assert [(r.row_id, r.reason) for r in rejected] == [(row.row_id, "too_long")]


def test_padding_is_masked(rows, tokenizer):
    enc = render_sft(rows[0], tokenizer, 4096, pad=True)
    assert len(enc["input_ids"]) == 4096
    n = sum(enc["attention_mask"])
    assert set(enc["labels"][n:]) == {IGNORE_INDEX} and set(enc["attention_mask"][n:]) == {0}


def test_a_template_that_breaks_the_prefix_is_named(rows, tokenizer):
    broken = tokenizer.chat_template.replace(
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}",
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\nSure. ' }}",
    )
    old = tokenizer.chat_template
    tokenizer.chat_template = broken
    try:
        with pytest.raises(SFTRenderError, match=rows[0].row_id):
            render_sft(rows[0], tokenizer, 100_000)
    finally:
        tokenizer.chat_template = old


@pytest.fixture(scope="module")
def qwen3(tokenizer, tmp_path_factory):
    from chat_templates import QWEN3, qwen_tokenizer

    return qwen_tokenizer(
        tokenizer.name_or_path, tmp_path_factory.mktemp("qwen3"), eos="<|im_end|>", template=QWEN3
    )


@pytest.mark.parametrize("thinking", [False, None])
def test_a_qwen3_template_renders_with_or_without_thinking(rows, qwen3, thinking):
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    empty = "<think>\n\n</think>\n\n"
    hermes = get_protocol("hermes")
    for row in rows[:6]:
        enc = render_sft(row, qwen3, 100_000, chat_template_kwargs=kwargs, tools=TOOLS)
        ids, labels = enc["input_ids"], enc["labels"]
        first = next(i for i, lab in enumerate(labels) if lab != IGNORE_INDEX)
        prompt = qwen3.decode(ids[:first])
        target = qwen3.decode([lab for lab in labels if lab != IGNORE_INDEX])
        action = hermes.render(row.target.content, list(row.target.calls))
        if thinking is False:
            # The switch puts the empty think block in the prompt; the model answers after it.
            assert prompt.endswith("<|im_start|>assistant\n" + empty)
            assert target == action + "<|im_end|>"
        else:
            # The template writes an empty think block before the last assistant turn.
            assert prompt.endswith("<|im_start|>assistant\n")
            assert target == empty + action + "<|im_end|>"


def test_the_export_records_its_chat_template_kwargs(toy, toy_bank, rows, qwen3, tmp_path):
    kwargs = {"enable_thinking": False}
    manifest = export_sft(
        toy_bank, toy, qwen3, tmp_path, 100_000, rows=rows[:4], chat_template_kwargs=kwargs
    )
    assert manifest["chat_template_kwargs"] == kwargs
    line = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert "<think>\n\n</think>" in qwen3.decode(line["input_ids"])


def test_split_is_grouped_by_trajectory_and_deterministic(rows):
    train, val = split_rows(rows, 0.25)
    assert train and val and len(train) + len(val) == len(rows)
    assert not {r.trajectory_id for r in train} & {r.trajectory_id for r in val}
    again = split_rows(list(reversed(rows)), 0.25)
    assert {r.row_id for r in again[1]} == {r.row_id for r in val}


def test_export_loads_with_datasets(toy, toy_bank, rows, tokenizer, tmp_path):
    datasets = pytest.importorskip("datasets")
    lengths = sorted(len(render_sft(r, tokenizer, 100_000)["input_ids"]) for r in rows)
    limit = lengths[-3]  # the longest rows must be rejected
    manifest = export_sft(
        toy_bank, toy, tokenizer, tmp_path, limit, validation_fraction=0.25, rows=rows
    )
    assert manifest["rejected"] >= 1 and manifest["rejected_by_reason"] == {
        "too_long": manifest["rejected"]
    }
    counts = manifest["splits"]
    assert counts["train"]["rows"] + counts["validation"]["rows"] + manifest["rejected"] == len(
        rows
    )
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    ds = datasets.load_dataset(
        "json",
        data_files={
            "train": str(tmp_path / "train.jsonl"),
            "validation": str(tmp_path / "validation.jsonl"),
        },
    )
    assert ds["train"].num_rows == counts["train"]["rows"]
    assert ds["validation"].num_rows == counts["validation"]["rows"]
    assert not set(ds["train"]["trajectory_id"]) & set(ds["validation"]["trajectory_id"])
    first = ds["train"][0]
    assert len(first["input_ids"]) == len(first["labels"]) <= limit
    assert set(json.loads(first["target"])) == {"content", "calls"}
    rejected = {r["row_id"] for r in manifest["rejections"]}
    assert not rejected & (set(ds["train"]["row_id"]) | set(ds["validation"]["row_id"]))
