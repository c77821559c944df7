"""The contract vocabulary a Benchmark speaks.

Rubric contracts (:mod:`~bat_gym.rubrics.contract.model`, with the YAML contracts of
the reference stages beside it), the check registry, what a check sees, and the
frozen workspace.

The contract model's names load from here on first use (``from bat_gym.rubrics.contract
import ContractLibrary``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "GateName": "bat_gym.rubrics.contract.model",
    "RubricItem": "bat_gym.rubrics.contract.model",
    "Level": "bat_gym.rubrics.contract.model",
    "Component": "bat_gym.rubrics.contract.model",
    "RubricContract": "bat_gym.rubrics.contract.model",
    "load_contract": "bat_gym.rubrics.contract.model",
    "ContractLibrary": "bat_gym.rubrics.contract.model",
    "REFERENCE_DIR": "bat_gym.rubrics.contract.model",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bat_gym.rubrics.contract' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
