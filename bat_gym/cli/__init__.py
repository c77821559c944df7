"""The ``bat-gym`` command line: one module per command, registered on one app.

Every command, bat_gym's own and those of other packages (the trainers among them), is
a plugin of :data:`COMMANDS` (entry point group ``bat_gym.commands``), so the core names
none of them. A command that needs an extra which is not installed stays listed, and
says in one line what to install (exit 2) instead of ending in a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from bat_gym.core.errors import BatGymError
from bat_gym.core.plugins import Expect, Registry, install_hint

__all__ = ["COMMANDS", "app", "main"]

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Staged benchmarks as Gymnasium environments."
)

COMMANDS: Registry[Any] = Registry("bat_gym.commands", expect=Expect("command"))
"""The commands, by name: a function (one command) or a Typer app (a group of them)."""

# A stand-in takes whatever the real command would have, to answer with the one line.
_ANY_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _missing_extra(name: str, exc: ImportError) -> str:
    """One line: what ``bat-gym NAME`` could not import, and the command that installs it."""
    try:
        point = COMMANDS.entry_point(name)
    except KeyError:  # not a declared command: the extras of bat-gym that bring the module
        hint = install_hint(exc)
    else:
        hint = install_hint(exc, getattr(point.dist, "name", "bat-gym"), tuple(point.extras))
    if hint is None:
        return f"bat-gym {name} cannot be imported: {exc}"
    return f"bat-gym {name} needs an extra that is not installed ({exc}); install it with: {hint}"


def _stand_in(name: str, exc: ImportError) -> Any:
    """A command that says what to install, in place of one whose module cannot be imported."""

    def command(ctx: typer.Context) -> None:
        typer.secho(f"error: {_missing_extra(name, exc)}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)

    command.__doc__ = f"(not installed: {exc})"
    return command


def _register_commands() -> None:
    for name in COMMANDS:
        try:
            command = COMMANDS[name]
        except ImportError as exc:
            app.command(name, context_settings=_ANY_ARGS)(_stand_in(name, exc))
            continue
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=name)
        else:
            app.command(name)(command)


_register_commands()


def main() -> None:
    """Run the app; a BatGymError or a missing extra prints one clean line instead of a traceback."""
    try:
        app()
    except BatGymError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(1)
    except ModuleNotFoundError as exc:
        # A command imports what its extra brings only when it runs (the trainers import
        # torch in their body, so that --help stays fast).
        name = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
        line = _missing_extra(name, exc)
        if "install it with" not in line:
            raise
        typer.secho(f"error: {line}", fg=typer.colors.RED, err=True)
        sys.exit(2)
