"""Register the ``bat/*`` ids with Gymnasium the moment Gymnasium is imported.

Run at interpreter start-up by ``bat_gym-autoregister.pth``, which loads this file by
path as a stand-alone module: importing the ``bat_gym`` package would import Gymnasium
(about 0.2 s) in every Python process of the environment. Here only the standard
library is touched: if Gymnasium is not loaded yet, a finder goes on ``sys.meta_path``
that steps aside after Gymnasium's own import completes, then registers. Any failure is
swallowed, because a broken plugin must never break an unrelated interpreter; importing
``bat_gym`` registers the ids too and reports errors normally.
"""

from __future__ import annotations

import importlib.util
import sys


def _register() -> None:
    try:
        from bat_gym.catalog import register_envs

        register_envs()
    except Exception:  # noqa: S110 - see module docstring
        pass


class _AfterGymnasium:
    # A meta path finder by duck typing: importlib.abc alone costs ~10 ms at start-up.
    # Found by this marker, not by class: the file may run twice under two module names
    # (loaded by path at start-up, imported as ``bat_gym._autoregister`` later).
    bat_gym_autoregister = True

    def find_spec(self, name, path, target=None):  # noqa: D102
        if name != "gymnasium":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


if "gymnasium" in sys.modules:
    _register()
elif not any(getattr(f, "bat_gym_autoregister", False) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterGymnasium())
