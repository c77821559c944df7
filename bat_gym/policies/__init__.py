"""Policies: every agent that plays bat_gym episodes, behind one protocol.

``make_policy(spec)`` builds one from the spec string the command line takes:

==========================  =====================================================
``teacher`` / ``naive``     the benchmark's scripted teacher / naive baseline
``teacher:recovery``        a teacher outcome the benchmark declares
``hf:PATH``                 a local Hugging Face causal LM (transformers)
``vllm:PATH``               the same through vLLM's offline engine (extra ``vllm``)
``openai:URL#MODEL``        an OpenAI-compatible chat-completions server
==========================  =====================================================
"""

from __future__ import annotations

from typing import Any

from bat_gym.errors import ConfigError
from bat_gym.policies.base import EpisodeContext, Policy, PolicyError, PolicyOutput, PolicyRequest
from bat_gym.policies.scripted import ScriptedPolicy

__all__ = [
    "EpisodeContext",
    "Policy",
    "PolicyError",
    "PolicyOutput",
    "PolicyRequest",
    "ScriptedPolicy",
    "make_policy",
]

SPEC_FORMS = ("teacher", "naive", "teacher:OUTCOME", "hf:PATH", "vllm:PATH", "openai:URL#MODEL")


def make_policy(spec: str, **options: Any) -> Policy:
    """Build a policy from a spec string (see the module doc); ``options`` go to its class.

    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) renders the prompts of
    ``hf:`` and ``vllm:`` policies; an ``openai:`` server gets them in each request's
    body, which vLLM's and SGLang's servers pass to the chat template.

    Raises:
        ValueError: the spec has none of the known forms; the message lists them.
    """
    kind, _, rest = spec.partition(":")
    if kind in ("vllm", "openai") and "max_new_tokens" in options:
        # One name on the command line; the server-style backends call it max_tokens.
        options["max_tokens"] = options.pop("max_new_tokens")
    if kind in ("teacher", "naive"):
        return ScriptedPolicy(kind, outcome=rest or "success", **options)  # type: ignore[arg-type]
    if kind == "hf" and rest:
        from bat_gym.policies.transformers_policy import TransformersPolicy

        return TransformersPolicy(rest, **options)
    if kind == "vllm" and rest:
        from bat_gym.policies.vllm_policy import VLLMPolicy

        return VLLMPolicy(rest, **options)
    if kind == "openai" and rest:
        template = options.pop("chat_template_kwargs", None)
        if template:
            options["extra_body"] = {
                **(options.get("extra_body") or {}),
                "chat_template_kwargs": dict(template),
            }
        url, sep, model = rest.partition("#")
        if not sep or not model:
            raise ConfigError(
                f"policy spec {spec!r}: write openai:URL#MODEL, e.g. openai:http://127.0.0.1:8000/v1#qwen"
            )
        from bat_gym.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(url, model, **options)
    raise ConfigError(f"unknown policy spec {spec!r}; use one of: {', '.join(SPEC_FORMS)}")
