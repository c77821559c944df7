"""The verifier and the rubric reward.

It scores an episode against its rubric contract with the built-in checks
(:mod:`bat_gym.rubrics.verifier.checks`); the rubric reward wraps a StageEnv with it.

The verdict's names load from here on first use (``from bat_gym.rubrics.verifier import
verify``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RejectionCategory": "bat_gym.rubrics.verifier.verdict",
    "rejected_verdict": "bat_gym.rubrics.verifier.verdict",
    "ItemVerdict": "bat_gym.rubrics.verifier.verdict",
    "StageVerdict": "bat_gym.rubrics.verifier.verdict",
    "GateVerdict": "bat_gym.rubrics.verifier.verdict",
    "Verdict": "bat_gym.rubrics.verifier.verdict",
    "evidence_completeness": "bat_gym.rubrics.verifier.verdict",
    "verify": "bat_gym.rubrics.verifier.verdict",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bat_gym.rubrics.verifier' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
