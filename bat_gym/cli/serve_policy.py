"""``bat-gym serve-policy``: any policy as an OpenAI-compatible chat-completions server."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import (
    BenchmarkName,
    ChatTemplateKwargs,
    MaxNewTokens,
    Temperature,
    build_policy,
    policy_options,
)
from bat_gym.policies import spec_forms

__all__ = ["serve_policy"]


def serve_policy(
    policy: Annotated[
        str,
        typer.Option("--policy", help="Policy spec: " + " | ".join(spec_forms())),
    ],
    benchmark: BenchmarkName = None,
    bank: Annotated[
        Path | None,
        typer.Option(
            "--bank",
            help="A Stage Bank directory (bank build --out): a scripted policy is served for "
            "every state in it. With --benchmark too, for both.",
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 127.0.0.1 keeps it on this machine.")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port; 0 picks a free one (printed)."),
    ] = 8000,
    max_new_tokens: MaxNewTokens = None,
    temperature: Temperature = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Sampling seed (model policies).")
    ] = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
) -> None:
    """Serve a policy at http://HOST:PORT/v1 (POST /chat/completions, GET /models).

    A scripted policy (teacher, naive) replays its script for the state each
    conversation is an episode of: the held-out start states of --benchmark (those
    bat-gym eval plays) and every state of --bank; a request may name its state in
    metadata.state_id. A model (hf:PATH) answers any conversation. Serves until Ctrl-C.
    """
    from bat_gym.integrations.policy_server import policy_server

    options = policy_options(policy, max_new_tokens, temperature, seed, chat_template_kwargs)
    agent = build_policy(policy, options)
    with (
        agent,
        policy_server(
            agent, benchmark=benchmark, bank=bank, model=policy, host=host, port=port
        ) as server,
    ):
        held = f", {len(server.states)} states" if server.states is not None else ""
        typer.echo(
            f"bat-gym serve-policy: {policy} at {server.url}{held}  (Ctrl-C stops)", err=True
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, _interrupt)
            server.serve_forever()


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the server as Ctrl-C does (a background job may ignore SIGINT)."""
    raise KeyboardInterrupt
