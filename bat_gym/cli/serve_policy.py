"""``bat-gym serve-policy``: any policy as an OpenAI-compatible chat-completions server."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from bat_gym.cli.options import BenchmarkName, ChatTemplateKwargs, parse_chat_template_kwargs
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
    max_new_tokens: Annotated[
        int | None,
        typer.Option("--max-new-tokens", min=1, help="Tokens per reply (model policies)."),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", min=0.0, help="Sampling temperature (model policies)."),
    ] = None,
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
    from bat_gym.integrations.policy_server import PolicyServer, load_states
    from bat_gym.policies import ScriptedPolicy, make_policy, policy_kind

    options = {
        k: v
        for k, v in {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "chat_template_kwargs": parse_chat_template_kwargs(chat_template_kwargs) or None,
        }.items()
        if v is not None
    }
    try:
        kind = policy_kind(policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
    if options and not kind.sampling:
        raise typer.BadParameter(
            f"{sorted(options)} apply to model policies, not {policy!r}: {kind.description}",
            param_hint="--policy",
        )
    try:
        agent = make_policy(policy, **options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
    with agent, tempfile.TemporaryDirectory(prefix="bat-serve-policy-") as scratch:
        states = None
        if isinstance(agent, ScriptedPolicy):
            states = load_states(benchmark, bank, store_dir=scratch)
        server = PolicyServer(agent, states, model=policy, host=host, port=port)
        held = f", {len(states)} states" if states is not None else ""
        typer.echo(
            f"bat-gym serve-policy: {policy} at {server.url}{held}  (Ctrl-C stops)", err=True
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
