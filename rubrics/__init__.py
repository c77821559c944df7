"""Rubric contracts as versioned data, the checks they name, and the verifier.

Two layers, one subpackage each: :mod:`bat_gym.rubrics.contract`, the vocabulary a
Benchmark speaks (beneath ``bat_gym.benchmark``), and :mod:`bat_gym.rubrics.verifier`,
which scores episodes and wraps a StageEnv as the rubric reward (above ``bat_gym.env``).
``import bat_gym.rubrics`` is light: names load on first use.
"""

from __future__ import annotations

from bat_gym.core.lazy import lazy_exports

_EXPORTS = {
    # contracts
    "RubricContract": "bat_gym.rubrics.contract.model",
    "RubricItem": "bat_gym.rubrics.contract.model",
    "Level": "bat_gym.rubrics.contract.model",
    "Component": "bat_gym.rubrics.contract.model",
    "ContractLibrary": "bat_gym.rubrics.contract.model",
    "load_contract": "bat_gym.rubrics.contract.model",
    # checks and what they see
    "register_check": "bat_gym.rubrics.contract.checks",
    "get_check": "bat_gym.rubrics.contract.checks",
    "check_names": "bat_gym.rubrics.contract.checks",
    "run_check": "bat_gym.rubrics.contract.checks",
    "CheckContext": "bat_gym.rubrics.contract.context",
    "CheckResult": "bat_gym.rubrics.contract.context",
    "CheckFailed": "bat_gym.rubrics.contract.context",
    "CheckUnscorable": "bat_gym.rubrics.contract.context",
    "Evidence": "bat_gym.rubrics.contract.context",
    "TaskOracle": "bat_gym.rubrics.contract.context",
    "FrozenWorkspace": "bat_gym.rubrics.contract.workspace",
    # the verifier and the reward
    "verify": "bat_gym.rubrics.verifier.verdict",
    "Verdict": "bat_gym.rubrics.verifier.verdict",
    "StageVerdict": "bat_gym.rubrics.verifier.verdict",
    "ItemVerdict": "bat_gym.rubrics.verifier.verdict",
    "GateVerdict": "bat_gym.rubrics.verifier.verdict",
    "RubricReward": "bat_gym.rubrics.verifier.reward",
    "make_env": "bat_gym.rubrics.verifier.reward",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
