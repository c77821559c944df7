"""Register the ``bat/*`` ids with Gymnasium the moment Gymnasium is imported.

Imported at interpreter start-up by ``bat_gym-autoregister.pth``. It imports nothing
heavy: if Gymnasium is not loaded yet it puts a finder on ``sys.meta_path`` that steps
aside after Gymnasium's own import completes, then registers. Any failure here is
swallowed, because a broken plugin must never break an unrelated interpreter; importing
``bat_gym`` registers the ids too and reports errors normally.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def _register() -> None:
    try:
        from bat_gym.registry import register_envs

        register_envs()
    except Exception:  # noqa: S110 - see module docstring
        pass


class _AfterGymnasium(importlib.abc.MetaPathFinder):
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
elif not any(isinstance(f, _AfterGymnasium) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterGymnasium())
