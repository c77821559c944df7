"""Local stand-ins for Qwen tokenizers: Qwen2.5-style ChatML and Qwen3-style thinking.

Tests build them from a tiny BPE tokenizer (nothing is downloaded): the pre-tokenizer is
Qwen2's split pattern (it keeps ``\\n\\n`` in one piece at the end of a prompt and in
the middle of a turn alike), the end-of-sequence token can be ``<|endoftext|>`` (as in
Qwen base tokenizers, whose chat turns still end in ``<|im_end|>``), and the Qwen3
variant has ``<think>``/``</think>`` as plain added tokens (decoding keeps them) and a
template with the behaviour of Qwen3's public one:

* ``enable_thinking=False`` adds an empty ``<think>\\n\\n</think>\\n\\n`` to the
  generation prompt;
* an assistant message's content is split at ``</think>`` into reasoning and content;
* assistant turns before the last user query lose their reasoning; turns after it
  are rendered ``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` when they are the last
  message or their reasoning is not empty, and ``{content}`` otherwise;
* tool calls are written as Hermes ``<tool_call>`` blocks, tool results as
  ``<tool_response>`` blocks in a user turn (consecutive ones in one turn).
"""

from __future__ import annotations

from pathlib import Path

from bat_gym.trainers.tiny_model import CHAT_TEMPLATE as CHATML

__all__ = ["CHATML", "QWEN3", "qwen_tokenizer", "qwen_model"]

# Qwen2's pre-tokenizer pattern (tokenizer.json of Qwen2 and later).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

QWEN3 = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
""".strip()


def qwen_tokenizer(
    base: str | Path, out_dir: str | Path, *, eos: str = "<|endoftext|>", template: str = CHATML
):
    """The tokenizer saved in ``base``, dressed as a Qwen one and saved in ``out_dir``.

    Args:
        base: a directory with a tiny tokenizer (``build_tokenizer`` output).
        out_dir: where the new tokenizer goes (may be ``base``).
        eos: the end-of-sequence token.
        template: the chat template; with :data:`QWEN3`, ``<think>`` and ``</think>``
            are added as plain tokens.

    Returns:
        The tokenizer, loaded back from ``out_dir``.
    """
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    if template == QWEN3:
        tok.add_tokens(["<think>", "</think>"])  # not special: decoding keeps them
    tok.eos_token = eos
    tok.chat_template = template
    tok.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def qwen_model(out_dir: str | Path, texts, *, eos: str = "<|endoftext|>", template: str = CHATML):
    """A tiny random model whose tokenizer is :func:`qwen_tokenizer`'s; returns its directory."""
    from transformers import AutoModelForCausalLM

    from bat_gym.trainers.tiny_model import build_tiny_model

    out_dir = Path(out_dir)
    build_tiny_model(out_dir, texts, vocab_size=600, hidden_size=64, num_layers=1, num_heads=1)
    tok = qwen_tokenizer(out_dir, out_dir, eos=eos, template=template)
    model = AutoModelForCausalLM.from_pretrained(out_dir)
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(out_dir)
    return out_dir
