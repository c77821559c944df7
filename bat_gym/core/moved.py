"""The module paths from before the folders by layer, still importable, with a warning.

``import bat_gym.errors`` gives ``bat_gym.core.errors`` itself (the same module object),
so a suite, a pickle or an entry point that names an old path keeps working while its
author moves to the new one; the :class:`DeprecationWarning` names it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "new_name", "install"]

_CORE = (
    "completion", "errors", "files", "plugins", "progress", "protocol", "pyparse", "record",
    "repair_record", "sandbox", "scripts", "service", "spec", "stages", "textspace",
    "tool_runner", "tools",
)  # fmt: skip
_VERIFIER = ("invocation", "judge", "provenance", "reading", "reference", "reward", "scoring")
_CHECKS = ("artifact", "episode", "reference", "repair", "tool")

MOVED: dict[str, str] = {
    **{f"bat_gym.{m}": f"bat_gym.core.{m}" for m in _CORE},
    "bat_gym.audit": "bat_gym.audits.leakage",
    "bat_gym.audit_reward": "bat_gym.audits.reward",
    "bat_gym.exploits": "bat_gym.audits.exploits",
    "bat_gym.docgen": "bat_gym.cli.docgen",
    **{f"bat_gym.rubrics.{m}": f"bat_gym.rubrics.contract.{m}" for m in ("checks", "context")},
    "bat_gym.rubrics.workspace": "bat_gym.rubrics.contract.workspace",
    "bat_gym.rubrics.contracts": "bat_gym.rubrics.contract",
    **{f"bat_gym.rubrics.{m}": f"bat_gym.rubrics.verifier.{m}" for m in _VERIFIER},
    **{f"bat_gym.rubrics.{m}_checks": f"bat_gym.rubrics.verifier.checks.{m}" for m in _CHECKS},
}
"""Old dotted path -> new one; a moved package's submodules move with it."""


def new_name(old: str) -> str | None:
    """Where the module once at ``old`` lives now; None if it did not move."""
    parts = old.split(".")
    for cut in range(len(parts), 0, -1):  # the longest moved prefix wins
        head = ".".join(parts[:cut])
        if head in MOVED:
            return ".".join([MOVED[head], *parts[cut:]])
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old path with the module at its new one."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("bat_gym.") or new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module is loaded); give it back the spec of its real path."""
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def install() -> None:
    """Put the finder of old paths first on ``sys.meta_path`` (once).

    First: the usual finder would load a module under a moved package's old path a
    second time, from the package's folder, as a module of its own.
    """
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
