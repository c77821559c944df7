"""``bat-gym envs``: list the registered env ids and benchmarks."""

from __future__ import annotations

import typer


def envs() -> None:
    """List the bat/* env ids, the installed benchmarks and the default one."""
    from bat_gym.catalog import default_benchmark_name, env_ids, get_benchmark, list_benchmarks

    default = default_benchmark_name()
    typer.echo(f"env ids (default benchmark: {default}):")
    for env_id in env_ids():
        typer.echo(f"  {env_id}")
    typer.echo("benchmarks:")
    for name in list_benchmarks():
        spec = get_benchmark(name).spec
        stages = " ".join(f"{s.id}:{s.name}" for s in spec.stages)
        tracks = ", ".join(t.name for t in spec.tracks)
        mark = " (default)" if name == default else ""
        typer.echo(f"  {name} {spec.version}{mark}\n    stages: {stages}\n    tracks: {tracks}")
