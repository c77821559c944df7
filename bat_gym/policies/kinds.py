"""The policy kinds bat_gym ships: each one's spec forms, description and how it is built.

Registered under the ``bat_gym.policies`` entry points in ``pyproject.toml``, as a
package registers its own. Each ``build`` imports its backend when it is called, so
listing the kinds (``bat-gym eval --help``) imports no model or HTTP code.
"""

from __future__ import annotations

from typing import Any

from bat_gym.core.errors import ConfigError
from bat_gym.policies.base import Policy, PolicyKind

__all__ = ["HF", "NAIVE", "OPENAI", "TEACHER", "VLLM"]


def _scripted(script: str, argument: str, options: dict[str, Any]) -> Policy:
    from bat_gym.policies.scripted import ScriptedPolicy

    return ScriptedPolicy(script, outcome=argument or "success", **options)  # type: ignore[arg-type]


def _model_path(kind: str, argument: str) -> str:
    if not argument:
        raise ConfigError(
            f"policy spec '{kind}:' names no model: write {kind}:PATH, e.g. {kind}:runs/sft/final"
        )
    return argument


def _hf(argument: str, **options: Any) -> Policy:
    from bat_gym.policies.transformers_policy import TransformersPolicy

    return TransformersPolicy(_model_path("hf", argument), **options)


def _vllm(argument: str, **options: Any) -> Policy:
    path = _model_path("vllm", argument)
    if "max_new_tokens" in options:
        # One name on the command line; vLLM's sampling parameters call it max_tokens.
        options["max_tokens"] = options.pop("max_new_tokens")
    from bat_gym.policies.vllm_policy import VLLMPolicy

    return VLLMPolicy(path, **options)


def _openai(argument: str, **options: Any) -> Policy:
    url, sep, model = argument.partition("#")
    if not url or not sep or not model:
        raise ConfigError(
            f"policy spec 'openai:{argument}': write openai:URL#MODEL, "
            "e.g. openai:http://127.0.0.1:8000/v1#qwen"
        )
    if "max_new_tokens" in options:
        # One name on the command line; the chat-completions API calls it max_tokens.
        options["max_tokens"] = options.pop("max_new_tokens")
    template = options.pop("chat_template_kwargs", None)
    if template:
        # In each request's body, which vLLM's and SGLang's servers pass to the template.
        options["extra_body"] = {
            **(options.get("extra_body") or {}),
            "chat_template_kwargs": dict(template),
        }
    from bat_gym.policies.openai_policy import OpenAIPolicy

    return OpenAIPolicy(url, model, **options)


TEACHER = PolicyKind(
    forms=("teacher", "teacher:OUTCOME"),
    description="the benchmark's scripted teacher (OUTCOME: another outcome it declares)",
    build=lambda argument, **options: _scripted("teacher", argument, options),
    sampling=False,
)

NAIVE = PolicyKind(
    forms=("naive",),
    description="the benchmark's naive baseline",
    build=lambda argument, **options: _scripted("naive", argument, options),
    sampling=False,
)

HF = PolicyKind(
    forms=("hf:PATH",),
    description="a local Hugging Face causal LM (transformers)",
    build=_hf,
)

VLLM = PolicyKind(
    forms=("vllm:PATH",),
    description="a local model through vLLM's offline engine (extra vllm)",
    build=_vllm,
)

OPENAI = PolicyKind(
    forms=("openai:URL#MODEL",),
    description="an OpenAI-compatible chat-completions server",
    build=_openai,
)
