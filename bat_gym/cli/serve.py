"""``bat-gym serve``: serve a stage env to agents outside bat_gym (``serve mcp``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import Backend, BenchmarkName

__all__ = ["app"]

app = typer.Typer(
    no_args_is_help=True, help="Serve a stage env to agents that are not bat_gym policies."
)


@app.command("mcp")
def mcp(
    state: Annotated[
        str, typer.Option("--state", help="The state to play, by id (bat-gym bank ls lists them).")
    ],
    states: Annotated[
        Path | None,
        typer.Option(
            "--states",
            help="A Stage Bank directory (bank build --out). Default: the benchmark's default "
            "states, built on first use.",
        ),
    ] = None,
    benchmark: BenchmarkName = None,
    backend: Backend = "local",
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            help="The protocol each call is written in for the env (its record reads the same).",
        ),
    ] = "hermes",
    http: Annotated[
        bool,
        typer.Option("--http", help="Streamable HTTP on 127.0.0.1 (at /mcp) instead of stdio."),
    ] = False,
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="The HTTP port on 127.0.0.1.")
    ] = 8000,
    max_turns: Annotated[
        int | None,
        typer.Option("--max-turns", min=1, help="Override the turn budget (one turn per call)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Keep the ended episode here: its trace (episodes/<state>.json, as bat-gym "
            "eval writes) and agent.json (the MCP client's name and version, the reward).",
        ),
    ] = None,
    max_tool_calls: Annotated[
        int | None,
        typer.Option("--max-tool-calls", min=0, help="Override the tool-call budget."),
    ] = None,
) -> None:
    """Serve one state's episode as MCP tools: execute_code, finish and the benchmark's own.

    The episode is scored by the rubric when the agent calls finish or a budget runs
    out; that call's result gives the reward and the verdict. On stdio the client starts
    this command; over HTTP it serves until Ctrl-C.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.env import StageEnv
    from bat_gym.integrations.mcp_server import serve
    from bat_gym.rubrics.reward import RubricReward

    bench = get_benchmark(benchmark)
    overrides = {"max_turns": max_turns, "max_tool_calls": max_tool_calls}
    budgets = bench.spec.budgets.model_copy(
        update={k: v for k, v in overrides.items() if v is not None}
    )
    env = RubricReward(
        StageEnv(
            benchmark=bench, backend=backend, protocol=protocol, budgets=budgets, states=states
        )
    )
    if http:
        typer.echo(f"bat-gym serve mcp: http://127.0.0.1:{port}/mcp  (Ctrl-C stops)", err=True)
    episode = serve(env, state, transport="http" if http else "stdio", port=port, out=out)
    if episode.verdict is not None:
        typer.echo(episode.ending(), err=True)
