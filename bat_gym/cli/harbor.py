"""``bat-gym harbor``: what runs inside an exported Harbor task (``bat-gym export harbor``).

``serve`` is the MCP sidecar's command, ``verify`` the separate verifier's
``tests/test.sh``; see :mod:`bat_gym.integrations.harbor_runtime`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Run inside an exported Harbor task.")

TaskFile = Annotated[
    Path, typer.Argument(help="The task file the export wrote (task.json).", show_default=False)
]


@app.command("serve")
def serve(
    task: TaskFile,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, help="Streamable HTTP on 127.0.0.1:PORT."),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Keep the ended episode here.")] = None,
) -> None:
    """Serve the task's episode as MCP tools (the sidecar of an exported task)."""
    from bat_gym.integrations.harbor_runtime import read_task, serve_task

    episode = serve_task(read_task(task), port=port, out=out)
    if episode.verdict is not None:
        typer.echo(episode.ending(), err=True)


@app.command("verify")
def verify(
    task: TaskFile,
    trace: Annotated[Path, typer.Option("--trace", help="What the sidecar kept (its --out).")],
    logs: Annotated[
        Path, typer.Option("--logs", help="Harbor's verifier folder (reward.json goes here).")
    ] = Path("/logs/verifier"),
) -> None:
    """Replay the agent's recorded calls on the rebuilt state and score them (the verifier)."""
    from bat_gym.integrations.harbor_runtime import read_task, verify_task

    result = verify_task(read_task(task), trace, logs)
    typer.echo(f"reward {result['reward']:.3f}: {result['summary']}")
    if result.get("explain"):
        typer.echo(result["explain"])
