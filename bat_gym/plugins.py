"""Named plugins: one registry per kind, fed by entry points and by this process.

bat_gym finds its benchmarks, policies, sandbox backends, tool protocols and target
selectors by name, each kind in a :class:`Registry`. A package adds one by declaring it
in the kind's entry point group, as bat_gym declares its own in its ``pyproject.toml``::

    [project.entry-points."bat_gym.sandboxes"]
    mysandbox = "my_package.sandbox:MySandbox"

or by calling :meth:`Registry.register` at run time. A registration in this process
takes precedence over an entry point of the same name.

Nothing is imported until a plugin is asked for: the names come from the entry points'
metadata, and a plugin is loaded (and checked, and kept) on first use. A name no one
declares raises the kind's :class:`~bat_gym.errors.PluginNotFound`, with close matches
and the known names; two installed packages that declare one name differently, or a
plugin that is not what its kind expects, raise :class:`~bat_gym.errors.PluginError`.

===================  ===============================================================
group                what each entry names
===================  ===============================================================
bat_gym.benchmarks   a :class:`~bat_gym.benchmark.Benchmark` or a factory of one
bat_gym.policies     a :class:`~bat_gym.policies.PolicyKind`
bat_gym.sandboxes    a :class:`~bat_gym.sandbox.Sandbox` subclass
bat_gym.protocols    a :class:`~bat_gym.protocol.ToolProtocol` subclass
bat_gym.selectors    a :class:`~bat_gym.selection.TargetSelector` subclass
===================  ===============================================================
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from bat_gym.errors import PluginError, PluginNotFound

__all__ = ["Registry", "load_target", "summary"]

T = TypeVar("T")


def load_target(target: str) -> Any:
    """The object a ``"module:attr"`` string names (``attr`` may be dotted).

    Raises:
        PluginError: the string has no ``:`` or names nothing.
        ImportError: the module (or one it imports) cannot be imported.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise PluginError(f"{target!r} is not 'module:attribute'")
    obj: Any = importlib.import_module(module.strip())
    for part in attr.strip().split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            shadow = _shadowing_folders(module.strip())
            raise PluginError(f"{target!r}: {module} has no attribute {attr!r}{shadow}") from None
    return obj


def _shadowing_folders(module: str) -> str:
    """Why ``module`` lacks an attribute when it was imported as a namespace package.

    A folder of that name without ``__init__.py`` (a project folder in the working
    directory, say) imports as an empty namespace package before an editable install's
    finder gets a turn, so the installed package is never seen.
    """
    top = sys.modules.get(module.split(".", 1)[0])
    if top is None or getattr(top, "__file__", None) is not None:
        return ""
    folders = ", ".join(str(folder) for folder in getattr(top, "__path__", ()))
    return (
        f"; {top.__name__} was imported from {folders}, a folder without __init__.py that "
        "shadows the installed package: run from another directory, or rename that folder"
    )


def summary(plugin: Any) -> str:
    """A plugin's one-line description: its ``description``, else its docstring's first line."""
    text = getattr(plugin, "description", None)
    if not isinstance(text, str) or not text.strip():
        text = getattr(plugin, "__doc__", None) or ""
    return text.strip().split("\n", 1)[0].strip()


class Registry(Mapping[str, T], Generic[T]):
    """The plugins of one kind, by name: a read-only mapping that loads on access.

    Iterating lists the names (registered here and declared as entry points) without
    loading anything; ``registry[name]`` loads the plugin, passes it through ``adapt``
    once, and keeps the result. ``name in registry`` loads nothing either.

    Args:
        group: the entry point group plugins of this kind are declared in.
        not_found: the error an unknown name raises (a
            :class:`~bat_gym.errors.PluginNotFound` subclass naming the kind).
        adapt: ``adapt(name, loaded)`` turns what an entry point or registration names
            into the plugin (calling a factory, say) and checks it, raising
            :class:`~bat_gym.errors.PluginError` for what the kind cannot use.
            Default: the loaded object as it is.
        shown: ``shown(registry)``: how the known names appear in the not-found error
            (a policy kind by its spec forms). Default: the names.
        spelling: maps a name to the form under which names are compared, for kinds
            whose names users may spell loosely (case, ``-`` for ``_``). A spelling
            that matches more than one name is not found. Default: exact names.
    """

    def __init__(
        self,
        group: str,
        *,
        not_found: type[PluginNotFound] = PluginNotFound,
        adapt: Callable[[str, Any], T] | None = None,
        shown: Callable[[Registry[T]], list[str]] | None = None,
        spelling: Callable[[str], str] | None = None,
    ) -> None:
        self.group = group
        self._not_found = not_found
        self._adapt: Callable[[str, Any], T] = adapt or (lambda name, obj: obj)
        self._shown = shown
        self._spelling = spelling
        self._registered: dict[str, Any] = {}
        self._loaded: dict[str, T] = {}

    # -- registering ------------------------------------------------------------------

    def register(self, name: str, plugin: Any) -> None:
        """Make ``plugin`` available under ``name`` in this process.

        Args:
            name: the name it is looked up by.
            plugin: the plugin, or a ``"module:attr"`` string naming it (imported on
                first use). It replaces an earlier registration or entry point of the
                same name.
        """
        self._registered[name] = plugin
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        """Forget a registration of this process (an entry point of the name comes back)."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    # -- looking up -------------------------------------------------------------------

    def _declared(self) -> dict[str, list[EntryPoint]]:
        return _declared().get(self.group, {})

    def _names(self) -> set[str]:
        return set(self._registered) | set(self._declared())

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names()))

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._match(name) is not None

    def _match(self, name: str) -> str | None:
        if name in self._loaded or name in self._registered:
            return name
        names = self._names()
        if name in names:
            return name
        if self._spelling is None:
            return None
        spelled = self._spelling(name)
        matches = [n for n in names if self._spelling(n) == spelled]
        return matches[0] if len(matches) == 1 else None

    def resolve(self, name: str) -> str:
        """The registered name ``name`` stands for (itself, or its one loose spelling).

        Raises:
            PluginNotFound: the kind's subclass, naming the known ones and close matches.
        """
        found = self._match(name)
        if found is None:
            known = sorted(self._names())
            shown = self._shown(self) if self._shown is not None else None
            raise self._not_found(name, known, shown=shown, group=self.group)
        return found

    def __getitem__(self, name: str) -> T:
        """The plugin registered as ``name``, loaded and adapted on first use.

        Raises:
            PluginNotFound: no plugin has that name.
            PluginError: two packages declare the name differently, or the plugin is
                not what its kind expects.
            ImportError: the plugin's module cannot be imported (an extra not installed).
        """
        if name in self._loaded:
            return self._loaded[name]
        name = self.resolve(name)
        if name in self._loaded:
            return self._loaded[name]
        target = self._registered.get(name)
        if target is None:
            target = self._entry_point(name).value
        plugin = self._adapt(name, load_target(target) if isinstance(target, str) else target)
        # Threads that load one name at once keep the first: a plugin is one object.
        return self._loaded.setdefault(name, plugin)

    def _entry_point(self, name: str) -> EntryPoint:
        declared = self._declared()[name]
        values = {ep.value.replace(" ", "") for ep in declared}
        if len(values) > 1:
            # Taking either would make the outcome depend on the order of sys.path.
            raise PluginError(
                f"{self.group} entry point {name!r} is declared differently by "
                + ", ".join(sorted(f"{_dist(ep)} ({ep.value})" for ep in declared))
                + "; uninstall one of them"
            )
        return declared[0]

    def describe(self) -> dict[str, str]:
        """Every name with its plugin's one-line description (this loads every plugin).

        A plugin that fails to load is described by its error, so that one broken
        package does not hide the others.
        """
        out = {}
        for name in self:
            try:
                out[name] = summary(self[name])
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the rest
                out[name] = f"(cannot be loaded: {type(exc).__name__}: {exc})"
        return out

    def __repr__(self) -> str:
        return f"Registry({self.group!r}: {', '.join(self)})"


_Declared = dict[str, dict[str, list[EntryPoint]]]  # group -> name -> entry points
_PathKey = tuple[tuple[str, int | None], ...]
_scan: tuple[_PathKey, _Declared] | None = None


def _path_key() -> _PathKey:
    """Each ``sys.path`` entry with its modification time (None where it is missing)."""
    key = []
    for entry in sys.path:
        try:
            key.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            key.append((entry, None))
    return tuple(key)


def _declared() -> _Declared:
    """Every installed entry point, by group and name: one scan while ``sys.path`` holds.

    Reading every distribution's metadata takes milliseconds, and the command line
    lists several kinds at start-up. Installing a distribution adds a folder to a
    ``sys.path`` entry (changing its modification time) or adds an entry, and either
    makes the next call scan again.
    """
    global _scan
    key = _path_key()
    if _scan is None or _scan[0] != key:
        found: _Declared = {}
        installed = entry_points()  # one read of every distribution's metadata
        for group in installed.groups:
            for ep in installed.select(group=group):
                found.setdefault(group, {}).setdefault(ep.name, []).append(ep)
        _scan = (key, found)
    return _scan[1]


def _dist(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "an unnamed distribution"
