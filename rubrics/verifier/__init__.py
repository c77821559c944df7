"""The verifier and the rubric reward.

It scores an episode against its rubric contract with the built-in checks
(:mod:`bat_gym.rubrics.verifier.checks`); the rubric reward wraps a StageEnv with it.

The verdict's names load from here on first use (``from bat_gym.rubrics.verifier import
verify``).
"""

from __future__ import annotations

from bat_gym.core.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
