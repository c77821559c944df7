"""The ``bat-gym-stages`` verifiers environment: Stage Bank states, played by the stage env.

``vf-eval bat-gym-stages`` and prime-rl (``id = "bat-gym-stages"``) import this module by
its name and take the one Taskset, Harness and Env subclass it exports; the classes live
in :mod:`bat_gym.integrations.verifiers`. Needs ``pip install 'bat-gym[verifiers]'``.
"""

from bat_gym.integrations.verifiers import StageEpisodes, StageHarness, StageTaskset

__all__ = ["StageEpisodes", "StageHarness", "StageTaskset"]
