"""Public names of a package, imported from the modules that define them on first use.

A package lists its names and their modules instead of importing them, so importing it
stays cheap (PEP 562: a module's ``__getattr__`` answers the names it does not hold).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], *, also: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names live elsewhere.

    Use: ``__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)``.

    Args:
        package: the package's dotted name (``__name__``), for the error message.
        exports: each public name -> the dotted name of the module defining it.
        also: public names the package holds itself (``__version__``), for ``dir()``.
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    listed = sorted({*exports, *also})

    def __dir__() -> list[str]:
        return listed

    return __getattr__, __dir__
