"""``bat-gym plugins``: every kind of plugin, its names, and the distribution declaring each."""

from __future__ import annotations

from typing import Annotated

import typer

from bat_gym.core.plugins import KINDS, declared, group_of

__all__ = ["plugins"]


def plugins(
    kind: Annotated[
        str | None,
        typer.Argument(help=f"Only this kind: {', '.join(KINDS)}.", show_default=False),
    ] = None,
) -> None:
    """List every kind of plugin, its names and the distribution declaring each.

    Read from the installed entry points: no plugin is imported.
    """
    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"{kind!r} is not a kind; the kinds are {', '.join(KINDS)}")
    for each in [kind] if kind else KINDS:
        rows = declared(group_of(each))
        typer.echo(f"{each} ({group_of(each)}): {KINDS[each]}")
        names = max((len(name) for name, _, _ in rows), default=0)
        dists = max((len(dist) for _, _, dist in rows), default=0)
        for name, target, dist in rows:
            typer.echo(f"  {name:{names}}  {dist:{dists}}  {target}")
        if not rows:
            typer.echo("  (none installed)")
