"""OpenEnv's typed client for a ``bat-gym serve openenv`` server.

:class:`BatEnvClient` is OpenEnv's own ``EnvClient`` (one WebSocket, one server-side
session, so one sandbox) typed with bat_gym's action, observation and state models:

>>> from bat_gym.integrations.openenv import BatAction  # doctest: +SKIP
>>> with BatEnvClient(base_url="http://127.0.0.1:8000").sync() as env:  # doctest: +SKIP
...     first = env.reset(state_id="toy-e2e-000")
...     result = env.step(BatAction(tool="finish", arguments={"summary": "done"}))
...     result.reward, result.observation.verdict, result.observation.stage_scores
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from bat_gym.integrations.openenv import BatAction, BatObservation, BatState

__all__ = ["BatEnvClient"]


class BatEnvClient(EnvClient[BatAction, BatObservation, BatState]):
    """OpenEnv's WebSocket client for :class:`~bat_gym.integrations.openenv.BatOpenEnv`.

    Async by default (``await env.reset(state_id=...)``); ``.sync()`` gives OpenEnv's
    blocking wrapper. ``reset`` takes ``state_id`` (and ``seed``, ``episode_id``).
    """

    def _step_payload(self, action: BatAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[BatObservation]:
        observation = BatObservation.model_validate(
            {
                **payload.get("observation", {}),
                "done": payload.get("done", False),
                "reward": payload.get("reward"),
            }
        )
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> BatState:
        return BatState.model_validate(payload)
