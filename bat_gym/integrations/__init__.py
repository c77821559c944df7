"""Adapters that plug bat_gym envs into third-party RL trainers.

Each adapter is glue: the env stays the single source of prompts, tool semantics and
rewards, and the token bookkeeping (prompt ids, sampled tokens with mask 1, env
replies with mask 0, the rubric reward) is one shared class,
:class:`bat_gym.rollout.TokenEpisode`, played by the one episode loop.

* :mod:`bat_gym.integrations.trl`: TRL ``GRPOTrainer`` (``rollout_func`` plus
  ``environment_factory``), ``bat_dataset`` and the ``rubric_reward`` function.
* :mod:`bat_gym.integrations.openenv`: an OpenEnv environment and server
  (``bat-gym serve openenv``); :mod:`~bat_gym.integrations.openenv_client` its typed
  client; :mod:`~bat_gym.integrations.trl_tools` TRL's ``environment_factory`` with
  public tool methods.
* :mod:`bat_gym.integrations.verl`: a verl agent loop, ``BatAgentLoop``.
* :mod:`bat_gym.integrations.skyrl`: a SkyRL-Gym text env, ``BatTextEnv``.
* :mod:`bat_gym.integrations.verifiers`: verifiers v1 (prime-rl), the ``bat-gym-stages``
  environment: ``StageTaskset``, ``StageHarness``, ``StageEpisodes``.

Importing this package imports no trainer framework; each submodule imports its own.
"""

from __future__ import annotations

from bat_gym.core.lazy import lazy_exports

__all__ = ["make_env", "state_rows"]

_EXPORTS = {
    "make_env": "bat_gym.integrations._states",
    "state_rows": "bat_gym.integrations._states",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
