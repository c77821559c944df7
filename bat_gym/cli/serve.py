"""``bat-gym serve``: serve a stage env to agents outside bat_gym (``serve mcp``, ``serve openenv``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from bat_gym.cli.options import Backend, BenchmarkName
from bat_gym.core.spec import Budgets

__all__ = ["app"]

StatesDir = Annotated[
    Path | None,
    typer.Option(
        "--states",
        help="A Stage Bank directory (bank build --out). Default: the benchmark's default "
        "states, built on first use.",
    ),
]
BudgetOverrides = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        metavar="NAME=VALUE",
        help="Override one of the benchmark's budgets (repeatable), e.g. max_turns=2 "
        "(each tool call is one turn): " + ", ".join(Budgets.model_fields) + ".",
    ),
]

app = typer.Typer(
    no_args_is_help=True, help="Serve a stage env to agents that are not bat_gym policies."
)


@app.command("mcp")
def mcp(
    state: Annotated[
        str,
        typer.Option("--state", help="The state to play, by id (a bank's rows.jsonl lists them)."),
    ],
    states: StatesDir = None,
    benchmark: BenchmarkName = None,
    backend: Backend = "local",
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            help="The protocol each call is written in for the env (its record reads the same).",
        ),
    ] = "hermes",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Keep the ended episode here: its trace (episodes/<state>.json, as bat-gym "
            "eval writes) and agent.json (the MCP client's name and version, the reward).",
        ),
    ] = None,
    http: Annotated[
        int | None,
        typer.Option(
            "--http",
            metavar="PORT",
            min=1,
            max=65535,
            help="Serve streamable HTTP on 127.0.0.1:PORT (at /mcp) instead of stdio.",
        ),
    ] = None,
    budget: BudgetOverrides = None,
) -> None:
    """Serve one state's episode as MCP tools: execute_code, finish and the benchmark's own.

    The episode is scored by the rubric when the agent calls finish or a budget runs
    out; that call's result gives the reward and the verdict. On stdio the client starts
    this command; over HTTP it serves until Ctrl-C.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.env import StageEnv
    from bat_gym.integrations.mcp_server import serve
    from bat_gym.rubrics.verifier.reward import RubricReward

    bench = get_benchmark(benchmark)
    budgets = _budgets(bench.spec.budgets, budget or [])
    env = RubricReward(
        StageEnv(
            benchmark=bench, backend=backend, protocol=protocol, budgets=budgets, states=states
        )
    )
    if http is not None:
        typer.echo(f"bat-gym serve mcp: http://127.0.0.1:{http}/mcp  (Ctrl-C stops)", err=True)
    episode = serve(env, state, http_port=http, out=out)
    if episode.verdict is not None:
        typer.echo(episode.ending(), err=True)


@app.command("openenv")
def openenv(
    states: StatesDir = None,
    benchmark: BenchmarkName = None,
    backend: Backend = "local",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="Serve on 127.0.0.1:PORT.")
    ] = 8000,
    max_sessions: Annotated[
        int,
        typer.Option(
            "--max-sessions",
            min=1,
            help="Concurrent sessions (WebSocket clients) admitted; each holds one sandbox.",
        ),
    ] = 64,
    budget: BudgetOverrides = None,
) -> None:
    """Serve Stage Bank states as an OpenEnv environment (HTTP and WebSocket) until Ctrl-C.

    A client resets a session to a state (reset(state_id=...)) and steps it one tool
    call at a time; the final step carries the rubric reward, the verdict and the stage
    scores. OpenEnv's typed client: bat_gym.integrations.openenv_client.BatEnvClient.
    """
    from bat_gym.catalog import get_benchmark
    from bat_gym.integrations.openenv import create_bat_app, serve

    bench = get_benchmark(benchmark)
    env_kwargs = {
        "benchmark": bench,
        "backend": backend,
        "budgets": _budgets(bench.spec.budgets, budget or []),
        "states": None if states is None else str(states),
    }
    app_ = create_bat_app("bat/E2E-v0", env_kwargs, max_concurrent_envs=max_sessions)
    typer.echo(f"bat-gym serve openenv: http://127.0.0.1:{port}  (Ctrl-C stops)", err=True)
    serve(app_, port)


def _budgets(default: Budgets, overrides: list[str]) -> Budgets:
    """``default`` with each ``NAME=VALUE`` of ``--budget`` applied, checked by the model."""
    values = default.model_dump()
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--budget")
        values[name.strip()] = value.strip()
    try:
        return Budgets.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        names = ", ".join(Budgets.model_fields)
        raise typer.BadParameter(
            f"{problems} (the budgets: {names})", param_hint="--budget"
        ) from None
