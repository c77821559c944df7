"""Inspect AI, native: a stage env as Inspect tasks, sandbox, tools and scorer.

``pip install 'bat-gym[inspect]'`` registers (through the ``inspect_ai`` entry point):

* tasks ``bat_gym/stage`` (a sample per Stage Bank state) and ``bat_gym/heldout`` (a
  sample per held-out cell, aggregates-only log): :mod:`~bat_gym.integrations.inspect.tasks`;
* the sandbox provider ``bat_gym``, the project's own sandbox behind the sample's
  StageEnv: :mod:`~bat_gym.integrations.inspect.sandbox`;
* the env's tools as Inspect tools and the solver playing them:
  :mod:`~bat_gym.integrations.inspect.agent`;
* the rubric as a scorer: :mod:`~bat_gym.integrations.inspect.scorer`.

Run ``inspect eval bat_gym/stage -T benchmark=toy_pipeline -T stage=validate
--model openai-api/...``; see docs/inspect.md.
"""

from __future__ import annotations

try:
    import inspect_ai  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra brings it
    raise ImportError(
        "bat_gym.integrations.inspect needs Inspect AI: pip install 'bat-gym[inspect]'"
    ) from exc

from bat_gym.integrations.inspect.agent import play_stage, stage_tools
from bat_gym.integrations.inspect.episode import StageEpisode
from bat_gym.integrations.inspect.sandbox import StageSandbox, StageSandboxConfig
from bat_gym.integrations.inspect.scorer import rubric_scorer
from bat_gym.integrations.inspect.tasks import heldout, stage

__all__ = [
    # tasks
    "heldout",
    "stage",
    # sandbox and episode
    "StageSandbox",
    "StageSandboxConfig",
    "StageEpisode",
    # tools, solver, scorer
    "play_stage",
    "rubric_scorer",
    "stage_tools",
]
