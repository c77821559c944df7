"""Rubric contracts as versioned data, the checks they name, and the verifier.

``import bat_gym.rubrics`` is light: names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # contracts
    "RubricContract": "bat_gym.rubrics.contract",
    "RubricItem": "bat_gym.rubrics.contract",
    "Level": "bat_gym.rubrics.contract",
    "Component": "bat_gym.rubrics.contract",
    "ContractLibrary": "bat_gym.rubrics.contract",
    "load_contract": "bat_gym.rubrics.contract",
    # checks and what they see
    "register_check": "bat_gym.rubrics.checks",
    "get_check": "bat_gym.rubrics.checks",
    "check_names": "bat_gym.rubrics.checks",
    "run_check": "bat_gym.rubrics.checks",
    "CheckContext": "bat_gym.rubrics.context",
    "CheckResult": "bat_gym.rubrics.context",
    "CheckFailed": "bat_gym.rubrics.context",
    "CheckUnscorable": "bat_gym.rubrics.context",
    "Evidence": "bat_gym.rubrics.context",
    "TaskOracle": "bat_gym.rubrics.context",
    "FrozenWorkspace": "bat_gym.rubrics.workspace",
    # the verifier and the reward
    "verify": "bat_gym.rubrics.verifier",
    "Verdict": "bat_gym.rubrics.verifier",
    "StageVerdict": "bat_gym.rubrics.verifier",
    "ItemVerdict": "bat_gym.rubrics.verifier",
    "GateVerdict": "bat_gym.rubrics.verifier",
    "RubricReward": "bat_gym.rubrics.reward",
    "make_env": "bat_gym.rubrics.reward",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bat_gym.rubrics' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
