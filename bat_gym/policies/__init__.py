"""Policies: every agent that plays bat_gym episodes, behind one protocol.

``make_policy(spec)`` builds one from the spec string the command line takes, ``KIND``
or ``KIND:ARGUMENT``. Each kind is a :class:`PolicyKind`, registered in
:data:`POLICIES` (entry point group ``bat_gym.policies``, where bat_gym declares its
own too), that declares its spec forms and a one-line description. Those shipped
with bat_gym:

{kinds}

``bat-gym eval --help`` and the error for an unknown kind list every installed kind
the same way (:func:`spec_forms`, :func:`kind_table`).
"""

from __future__ import annotations

from typing import Any

from bat_gym.core.errors import PluginError, PolicyNotFound
from bat_gym.core.plugins import Expect, Registry
from bat_gym.policies.base import (
    EpisodeContext,
    Policy,
    PolicyError,
    PolicyKind,
    PolicyOutput,
    PolicyRequest,
    SeedKey,
    keyed_seed,
)
from bat_gym.policies.scripted import ScriptedPolicy

__all__ = [
    "POLICIES",
    "EpisodeContext",
    "Policy",
    "PolicyError",
    "PolicyKind",
    "PolicyOutput",
    "PolicyRequest",
    "ScriptedPolicy",
    "SeedKey",
    "keyed_seed",
    "kind_table",
    "make_policy",
    "policy_kind",
    "spec_forms",
]


def _forms_checked(name: str, kind: PolicyKind) -> PolicyKind:
    strays = [f for f in kind.forms if f.partition(":")[0] != name]
    if not kind.forms or strays:
        raise PluginError(
            f"policy kind {name!r} declares the forms {list(kind.forms)}; each must start "
            f"with {name!r} (as '{name}' or '{name}:ARGUMENT')"
        )
    return kind


def _forms_of(registry: Registry[PolicyKind]) -> list[str]:
    forms = []
    for name in registry:
        try:
            forms += registry[name].forms
        except Exception:  # noqa: BLE001 - a broken kind is still a name to list
            forms.append(name)
    return forms


POLICIES: Registry[PolicyKind] = Registry(
    "bat_gym.policies",
    expect=Expect("policy kind", PolicyKind),
    adapt=_forms_checked,
    not_found=PolicyNotFound,
    shown=_forms_of,
)
"""The policy kinds, by name: the part of a spec before its first ``:``."""


def policy_kind(spec: str) -> PolicyKind:
    """The kind of policy ``spec`` names.

    Raises:
        PolicyNotFound: no kind has that name; the message lists every spec form.
    """
    return POLICIES[spec.partition(":")[0]]


def make_policy(spec: str, **options: Any) -> Policy:
    """Build a policy from a spec string; ``options`` go to its kind's ``build``.

    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) renders the prompts of
    ``hf:`` and ``vllm:`` policies; an ``openai:`` server gets them in each request's
    body, which vLLM's and SGLang's servers pass to the chat template.

    Raises:
        PolicyNotFound: the spec's kind is unknown; the message lists the spec forms
            (a ``ValueError``).
        ConfigError: the kind cannot take the spec's argument; the message names the
            form to write.
    """
    _, _, argument = spec.partition(":")
    return policy_kind(spec).build(argument, **options)


def spec_forms() -> list[str]:
    """The spec forms of every installed kind, in the order of their names."""
    return _forms_of(POLICIES)


def kind_table(kinds: dict[str, PolicyKind] | None = None) -> str:
    """A reStructuredText table of spec forms and descriptions (default: every installed kind)."""
    kinds = dict(POLICIES) if kinds is None else kinds
    if not kinds:
        return "(none installed)"
    rows = [
        (" / ".join(f"``{f}``" for f in kind.forms), kind.description) for kind in kinds.values()
    ]
    width = max(len(form) for form, _ in rows)
    rule = f"{'=' * width}  {'=' * max(len(d) for _, d in rows)}"
    return "\n".join([rule, *(f"{form:{width}}  {text}" for form, text in rows), rule])


def _shipped() -> dict[str, PolicyKind]:
    """The kinds bat_gym's own distribution declares (what this module's docstring shows)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        declared = distribution("bat-gym").entry_points
    except PackageNotFoundError:  # run from a source tree that is not installed
        return {}
    return {ep.name: POLICIES[ep.name] for ep in declared if ep.group == POLICIES.group}


if __doc__:  # None under python -OO
    __doc__ = __doc__.replace("{kinds}", kind_table(_shipped()))
