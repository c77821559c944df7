"""``bat-gym harbor``: what runs inside an exported Harbor task, and its jobs read back.

``serve`` is the MCP sidecar's command, ``verify`` the separate verifier's
``tests/test.sh`` (:mod:`bat_gym.integrations.harbor_runtime`); ``import`` reads a
Harbor job back as an evaluation (:mod:`bat_gym.integrations.harbor_jobs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["app"]

app = typer.Typer(
    no_args_is_help=True, help="Run inside an exported Harbor task; read its jobs back."
)

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


@app.command("import")
def import_(
    job: Annotated[
        Path, typer.Argument(help="A job folder `harbor run` wrote.", show_default=False)
    ],
    out: Annotated[Path, typer.Option("--out", help="The evaluation folder to write.")],
) -> None:
    """Read a Harbor job's trials back as a bat-gym evaluation (for bat-gym view)."""
    from bat_gym.integrations.harbor_jobs import import_job

    for run in import_job(job, out):
        typer.echo(f"{run}  (bat-gym view {run})")
