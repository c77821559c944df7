"""What the ``inspect_ai`` entry point loads: registering the tasks, sandbox and hooks.

Inspect imports this module when a ``bat_gym/...`` name is looked up (``inspect eval
bat_gym/stage``, ``sandbox="bat_gym"``); importing it is what registers them.
"""

from bat_gym.integrations.inspect.sandbox import StageSandbox
from bat_gym.integrations.inspect.tasks import HeldOutFirewall, heldout, stage

__all__ = ["HeldOutFirewall", "StageSandbox", "heldout", "stage"]
