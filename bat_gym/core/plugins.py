"""Named plugins: one registry mechanism for every kind, fed by entry points and by this process.

bat_gym finds each kind of plugin by name in a :class:`Registry`. A package adds one by
declaring it in the kind's entry point group, as bat_gym declares its own in its
``pyproject.toml``::

    [project.entry-points."bat_gym.sandboxes"]
    mysandbox = "my_package.sandbox:MySandbox"

or by calling the registry's :meth:`Registry.register` at run time. A registration in
this process takes precedence over an entry point of the same name.

Nothing is imported until a plugin is asked for: the names come from the entry points'
metadata (``bat-gym plugins`` lists them with the distribution that declares each), and
a plugin is loaded, checked against its kind's :class:`Expect`, and kept on first use. A
name no one declares raises the kind's :class:`~bat_gym.core.errors.PluginNotFound`, with
close matches and the known names; two installed packages that declare one name
differently, or a plugin that is not what its kind expects, raise
:class:`~bat_gym.core.errors.PluginError`. An entry point may name the extras its plugin
needs (``train = "my_package.cli:train [train]"``): when they are missing,
:func:`install_hint` says what to install. :data:`KINDS` lists every kind with what
its entry points name; ``bat-gym plugins`` lists what is installed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

from bat_gym.core.errors import PluginError, PluginNotFound

__all__ = [
    "KINDS",
    "Expect",
    "Registry",
    "declared",
    "group_of",
    "install_hint",
    "load_target",
    "summary",
]

T = TypeVar("T")

KINDS: dict[str, str] = {
    "benchmarks": "a Benchmark, or a factory of one",
    "policies": "a PolicyKind (spec forms, description, build)",
    "sandboxes": "a Sandbox subclass",
    "protocols": "a ToolProtocol subclass",
    "selectors": "a TargetSelector subclass",
    "checks": "a rubric check: a function (ctx, *, **args) -> CheckResult",
    "exploits": "a factory (keyword options) -> the exploit's Policy",
    "commands": "a function or Typer app: the bat-gym command of that name",
    "state_sources": "a resolver (states, benchmark) -> StateSource; 'default' is used",
}
"""Every kind of plugin, by name, with what each of its entry points names. The kind
``X`` is declared in the entry point group ``bat_gym.X`` (:func:`group_of`)."""


def group_of(kind: str) -> str:
    """The entry point group of a kind of :data:`KINDS`: ``bat_gym.<kind>``."""
    return f"bat_gym.{kind}"


_OWN_GROUPS = frozenset(map(group_of, KINDS))


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


@dataclass(frozen=True)
class Expect:
    """What a plugin of one kind must be: the check every registry runs on what it loads.

    Args:
        noun: the kind in messages (``"sandbox backend"``).
        base: the class a plugin is an instance (or subclass) of, or a ``"module:attr"``
            naming it (imported at the first check, so a low layer can name a high
            one); None: any callable.
        subclass: the plugin is a subclass of ``base``, not an instance.
        factory: a callable that is not a ``base`` yet is called (no arguments) to make one.
        self_name: a dotted attribute of the plugin that must equal the name it is
            registered under (``"spec.name"``); where it is missing, the name stands.
    """

    noun: str
    base: type | str | None = None
    subclass: bool = False
    factory: bool = False
    self_name: str | None = None

    def __call__(self, name: str, plugin: Any) -> Any:
        """``plugin`` (made, where it is a factory) if it is what the kind expects.

        Raises:
            PluginError: naming the plugin, what it is, and what was expected.
        """
        base = load_target(self.base) if isinstance(self.base, str) else self.base
        if self.factory and base is not None and not isinstance(plugin, base) and callable(plugin):
            plugin = plugin()
        if base is None:
            fits, wanted = callable(plugin), "callable"
        elif self.subclass:
            fits = isinstance(plugin, type) and issubclass(plugin, base)
            wanted = f"a {base.__name__} subclass"
        else:
            fits, wanted = isinstance(plugin, base), f"a {base.__name__}"
        if not fits:
            raise PluginError(f"{self.noun} {name!r} is {plugin!r}, not {wanted}")
        if self.self_name is not None:
            own: Any = plugin
            for part in self.self_name.split("."):
                own = getattr(own, part, name)
            if own != name:
                raise PluginError(
                    f"{self.noun} registered as {name!r} calls itself {own!r}; set its "
                    f"{self.self_name} to the name it is registered under"
                )
        return plugin


class Registry(Mapping[str, T], Generic[T]):
    """The plugins of one kind, by name: a read-only mapping that loads on access.

    Iterating lists the names without loading anything: those registered in this
    process in their order, then the other declared entry points sorted.
    ``registry[name]`` loads the plugin, checks it (``expect``, then ``adapt``) once,
    and keeps the result. ``name in registry`` loads nothing either.

    Args:
        group: the entry point group plugins of this kind are declared in.
        expect: what a plugin must be (default: anything).
        adapt: ``adapt(name, plugin)``, after ``expect``: turns the plugin into what the
            kind keeps, raising :class:`~bat_gym.core.errors.PluginError` for what the kind
            cannot use beyond ``expect``'s check. Default: the plugin as it is.
        not_found: the error an unknown name raises (a
            :class:`~bat_gym.core.errors.PluginNotFound` subclass naming the kind).
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
        expect: Expect | None = None,
        adapt: Callable[[str, Any], T] | None = None,
        not_found: type[PluginNotFound] = PluginNotFound,
        shown: Callable[[Registry[T]], list[str]] | None = None,
        spelling: Callable[[str], str] | None = None,
    ) -> None:
        self.group = group
        self._expect = expect
        self._adapt = adapt
        self._not_found = not_found
        self._shown = shown
        self._spelling = spelling
        self._registered: dict[str, Any] = {}
        self._loaded: dict[str, T] = {}

    # -- registering ------------------------------------------------------------------

    def register(self, name: str, plugin: Any, *, unique: bool = False) -> None:
        """Make ``plugin`` available under ``name`` in this process.

        Args:
            name: the name it is looked up by.
            plugin: the plugin, or a ``"module:attr"`` string naming it (imported on
                first use). It replaces an earlier registration or entry point of the
                same name, unless ``unique``.
            unique: refuse a name another plugin holds (registered here, or declared
                by an entry point naming another object); the same function
                registered again (its module imported twice) is no conflict.

        Raises:
            PluginError: ``unique`` and the name is taken.
        """
        if unique:
            holder = self._holder(name)
            if holder is not None and holder != _target_of(plugin):
                raise PluginError(f"{self.group} {name!r} is already registered by {holder}")
        self._registered[name] = plugin
        self._loaded.pop(name, None)

    def _holder(self, name: str) -> str | None:
        if name in self._registered:
            return _target_of(self._registered[name])
        points = self._declared().get(name)
        return f"{points[0].module}:{points[0].attr}" if points else None

    def unregister(self, name: str) -> None:
        """Forget a registration of this process (an entry point of the name comes back)."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    # -- looking up -------------------------------------------------------------------

    def _declared(self) -> dict[str, list[EntryPoint]]:
        return _declared().get(self.group, {})

    def _names(self) -> list[str]:
        declared = sorted(set(self._declared()) - set(self._registered))
        return [*self._registered, *declared]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

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
        if found is None and not self._declared() and self.group in _OWN_GROUPS:
            # bat_gym declares plugins of every kind itself: none at all means the
            # installed metadata predates this source (an editable install not redone).
            raise PluginError(
                f"no installed distribution declares a {self.group} entry point, not even "
                f"bat-gym: its installed metadata is older than its source; reinstall it "
                f"({sys.executable} -m pip install -e '{Path(__file__).resolve().parents[1]}')"
            )
        if found is None:
            shown = self._shown(self) if self._shown is not None else None
            raise self._not_found(name, self._names(), shown=shown, group=self.group)
        return found

    def __getitem__(self, name: str) -> T:
        """The plugin registered as ``name``, loaded and checked on first use.

        Raises:
            PluginNotFound: no plugin has that name.
            PluginError: two packages declare the name differently, or the plugin is
                not what its kind expects.
            ImportError: the plugin's module cannot be imported (an extra not
                installed: :func:`install_hint` says which).
        """
        if name in self._loaded:
            return self._loaded[name]
        name = self.resolve(name)
        if name in self._loaded:
            return self._loaded[name]
        target = self._registered.get(name)
        if target is None:
            point = self.entry_point(name)
            target = f"{point.module}:{point.attr}"  # without the extras it may name
        plugin = load_target(target) if isinstance(target, str) else target
        if self._expect is not None:
            plugin = self._expect(name, plugin)
        if self._adapt is not None:
            plugin = self._adapt(name, plugin)
        # Threads that load one name at once keep the first: a plugin is one object.
        return self._loaded.setdefault(name, plugin)

    def entry_point(self, name: str) -> EntryPoint:
        """The installed entry point that declares ``name`` (``KeyError`` if none does).

        Raises:
            PluginError: two distributions declare the name differently.
        """
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


def _target_of(plugin: Any) -> str:
    """``"module:qualname"`` of a plugin object (a string target as it is)."""
    if isinstance(plugin, str):
        return plugin.replace(" ", "")
    module = getattr(plugin, "__module__", None)
    qualname = getattr(plugin, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(plugin)


# -- what is installed ----------------------------------------------------------------

_Declared = dict[str, dict[str, list[EntryPoint]]]  # group -> name -> entry points
_Metadata = frozenset[tuple[str, int]]
_PathKey = tuple[tuple[str, _Metadata], ...]
_scan: tuple[_PathKey, _Declared] | None = None
# Per sys.path entry: its modification time when last listed, and its metadata folders.
_listed: dict[str, tuple[int | None, _Metadata]] = {}
_METADATA_SUFFIXES = (".dist-info", ".egg-info")


def _metadata_of(entry: str) -> _Metadata:
    """The distribution metadata folders in one ``sys.path`` entry, with their mtimes.

    An entry's own mtime changes with any file made in it (the working directory, a
    script's folder under a busy temp dir), so it only says when to list it again;
    the metadata folders say whether what is installed changed.
    """
    try:
        mtime: int | None = os.stat(entry or ".").st_mtime_ns
    except OSError:
        mtime = None
    cached = _listed.get(entry)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    found: _Metadata = frozenset()
    if mtime is not None:
        with contextlib.suppress(OSError), os.scandir(entry or ".") as it:
            found = frozenset(
                (e.name, e.stat().st_mtime_ns) for e in it if e.name.endswith(_METADATA_SUFFIXES)
            )
    _listed[entry] = (mtime, found)
    return found


def _path_key() -> _PathKey:
    """Each ``sys.path`` entry with the distribution metadata it holds."""
    return tuple((entry, _metadata_of(entry)) for entry in sys.path)


def _declared() -> _Declared:
    """Every installed entry point, by group and name: one scan while ``sys.path`` holds.

    Reading every distribution's metadata takes tens of milliseconds, and an env's
    first reset looks plugins up dozens of times. Installing a distribution adds or
    replaces a metadata folder in a ``sys.path`` entry, or adds an entry, and either
    makes the next call scan again; other files coming and going do not.
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


def declared(group: str) -> list[tuple[str, str, str]]:
    """``(name, target, distribution)`` of every entry point of ``group``, by name.

    Reads metadata only: nothing is imported.
    """
    return sorted(
        (name, ep.value, _dist(ep))
        for name, eps in _declared().get(group, {}).items()
        for ep in eps
    )


def _dist(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "an unnamed distribution"


# -- missing extras -------------------------------------------------------------------

_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def install_hint(
    exc: ImportError, dist: str = "bat-gym", extras: tuple[str, ...] = ()
) -> str | None:
    """The command that installs the module ``exc`` found missing, or None if no extra brings it.

    Args:
        exc: the import error (its ``name`` is the missing module).
        dist: the distribution whose extras may bring it.
        extras: the extras the plugin declares it needs (an entry point's
            ``[extra]``); where empty, the extras of ``dist`` that require a
            distribution named like the missing module's top-level package.

    Returns:
        ``"<this python> -m pip install 'dist[extra]'"`` (``-e`` and the source folder
        for an editable install), with this environment's own pip, so it lands where
        the command runs.
    """
    missing = _normal((exc.name or "").partition(".")[0])
    try:
        meta = distribution(dist)
    except PackageNotFoundError:
        return None
    if not extras:
        found = []
        for req in meta.requires or []:
            name = re.match(r"[A-Za-z0-9._-]+", req)
            extra = _EXTRA.search(req)
            if missing and name and extra and _normal(name.group()) == missing:
                found.append(extra.group(1))
        extras = tuple(dict.fromkeys(found))[:1]
    if not extras:
        return None
    where = f"{meta.metadata['Name']}[{','.join(extras)}]"
    url = json.loads(meta.read_text("direct_url.json") or "{}")
    if url.get("dir_info", {}).get("editable") and url.get("url", "").startswith("file://"):
        where = f"-e {url['url'].removeprefix('file://')}[{','.join(extras)}]"
    return f"{sys.executable} -m pip install '{where}'".replace("'-e ", "-e '")
