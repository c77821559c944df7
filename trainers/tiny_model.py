r"""Tiny Qwen3-style causal LMs built on the spot: a BPE tokenizer and a random-init model.

For tests, examples and learnability runs that must not download anything. The model is
saved with ``save_pretrained`` and loaded back through ``AutoModelForCausalLM`` /
``AutoTokenizer``, so everything downstream goes through the real loading code.

The chat template is Qwen-style ChatML: the tool schemas go into the system turn, the
assistant writes Hermes ``<tool_call>\n{...}\n</tool_call>`` blocks (exactly as
:class:`bat_gym.core.protocol.HermesProtocol` renders them), and tool results come back as
``<tool_response>`` blocks in a user turn. The head size is 64, which every
attention backend (vLLM's included) supports.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "benchmark_corpus",
    "build_tokenizer",
    "build_tiny_model",
    "random_init",
    "random_words",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    '{{- \'\\n</tools>\\nCall a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call>'
    "<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message.tool_calls is defined and message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set args = tc.function.arguments %}"
    '{{- \'<tool_call>\\n{"name": "\' + tc.function.name + \'", "arguments": \' }}'
    "{%- if args is string %}{{- args }}{%- else %}{{- args | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer(texts: Iterable[str], out_dir: str | Path, *, vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer on ``texts`` and save it with the chat template.

    Args:
        texts: the training corpus (prompts and teacher turns are a good one).
        out_dir: where ``tokenizer.json`` and its config are written.
        vocab_size: target vocabulary size, special tokens included.

    Returns:
        The tokenizer, loaded back with ``AutoTokenizer.from_pretrained(out_dir)``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def build_tiny_model(
    out_dir: str | Path,
    texts: Iterable[str],
    *,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position_embeddings: int = 8192,
    seed: int = 0,
) -> Path:
    """Build, randomly initialise and save a Qwen3-style model with its tokenizer.

    Args:
        out_dir: the model directory (loadable with ``AutoModelForCausalLM``).
        texts: the tokenizer's training corpus.
        vocab_size: BPE vocabulary size.
        hidden_size: model width; the head size is ``hidden_size // num_heads`` and
            should stay 64 for vLLM.
        num_layers: decoder layers.
        num_heads: attention heads (key/value heads too).
        max_position_embeddings: longest sequence the rotary embedding is set up for.
        seed: the init seed (same seed, same weights).

    Returns:
        ``out_dir``.
    """
    from transformers import Qwen3Config

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(texts, out_dir, vocab_size=vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = random_init(config, seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    return out_dir


def random_init(config: Any, *, seed: int = 0) -> Any:
    """A causal LM of ``config`` (any ``transformers`` config) with seeded random float32 weights.

    Same config and seed, same weights: the models the trainer benchmarks measure are
    built here, saved (:func:`build_tiny_model`) or held in memory.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def random_words(
    lines: int = 400, *, vocabulary: int = 3000, words_per_line: int = 50, seed: int = 0
) -> list[str]:
    """``lines`` lines of made-up lowercase words (2-9 letters): a corpus with no meaning.

    For a tokenizer whose model reads random token ids anyway (speed and memory runs).
    """
    rng = random.Random(seed)
    words = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(vocabulary)
    ]
    return [" ".join(rng.choices(words, k=words_per_line)) for _ in range(lines)]


def benchmark_corpus(benchmark: str | None = None, *, tasks_per_track: int = 2) -> list[str]:
    """What a model trained on ``benchmark`` reads and writes: its prompts and teacher turns.

    The system prompt of every focus (the Hermes tool protocol, the stage skills), the
    user prompts and the teacher's turns of ``tasks_per_track`` training tasks per
    track, every outcome the benchmark declares. A tokenizer trained on it covers the
    benchmark's text without a Stage Bank being built.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.core.protocol import get_protocol

    bench = get_benchmark(benchmark)
    protocol = get_protocol("hermes")
    texts = [bench.system_prompt(f, protocol) for f in bench.spec.focuses]
    seeds = bench.seeds("train")
    for track in bench.spec.tracks:
        for seed in seeds[:tasks_per_track]:
            task = bench.make_task(track.name, seed, "train")
            texts += [bench.user_prompt(task, f) for f in bench.spec.focuses]
            for outcome in bench.outcomes:
                for turn in bench.teacher_script(task, outcome):
                    texts.append(protocol.render(turn.content, list(turn.calls)))
    return texts
