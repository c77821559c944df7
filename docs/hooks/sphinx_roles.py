"""Sphinx cross-reference roles in docstrings as plain code spans (a griffe extension).

The code's docstrings name other objects the way Sphinx does (``:class:`~bat_gym.bank.StageBank```),
which reads well in the source and in ``help()``; on the API pages the role would show
as literal text. ``~`` keeps only the last dotted part, as Sphinx renders it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def _rewrite(obj: Any) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _rewrite(member)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring's roles once a package is loaded, before any is parsed."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        """Walk the package's modules, classes, functions and attributes."""
        _rewrite(pkg)
