"""The ``bat-gym`` command line: one module per command, registered on one app."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

from bat_gym.errors import BatGymError

__all__ = ["app", "main"]

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Staged benchmarks as Gymnasium environments."
)


def _register_commands() -> None:
    from bat_gym.cli import bank, demo, envs, evaluate, gate, view
    from bat_gym.cli.audit_reward import audit_reward
    from bat_gym.cli.new_benchmark import new_benchmark

    app.command("demo")(demo.demo)
    app.command("envs")(envs.envs)
    app.add_typer(bank.app, name="bank")
    app.command("eval")(evaluate.evaluate)
    app.command("gate")(gate.gate)
    app.command("audit-reward")(audit_reward)
    app.command("new-benchmark")(new_benchmark)
    app.command("view")(view.view)
    # Commands of other packages (the trainers among them) arrive as entry points, so
    # the core names none of them.
    for ep in entry_points(group="bat_gym.commands"):
        try:
            command = ep.load()
        except ImportError:
            continue  # an extra that is not installed: its command is absent
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=ep.name)
        else:
            app.command(ep.name)(command)


_register_commands()


def main() -> None:
    """Run the app; a BatGymError prints one clean line instead of a traceback."""
    try:
        app()
    except BatGymError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(1)
