"""The contract vocabulary a Benchmark speaks.

Rubric contracts (:mod:`~bat_gym.rubrics.contract.model`, with the YAML contracts of
the reference stages beside it), the check registry, what a check sees, and the
frozen workspace.

The contract model's names load from here on first use (``from bat_gym.rubrics.contract
import ContractLibrary``).
"""

from __future__ import annotations

from bat_gym.core.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
