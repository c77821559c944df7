"""The catalog: the installed benchmarks, the ``bat/*`` env ids, and where an env's states come from.

A benchmark package declares, in its ``pyproject.toml``::

    [project.entry-points."bat_gym.benchmarks"]
    my_bench = "my_package.bench:benchmark"   # a Benchmark instance or a factory

or calls :func:`register_benchmark` at import time. The shipped suites register the
same way. Nothing is imported until a benchmark is asked for (:data:`BENCHMARKS` is
their :class:`~bat_gym.core.plugins.Registry`). The default benchmark is
``BAT_GYM_BENCHMARK`` if set, else the installed one with the highest
``spec.default_priority``.

:func:`state_source` resolves where an env's states come from when it is given none
(the benchmark's default states, built on first use) or a bank directory. The resolver
is the ``default`` plugin of :data:`STATE_SOURCES` (entry point group
``bat_gym.state_sources``, where bat_gym declares the Stage Bank's), loaded on first
use, so :class:`~bat_gym.env.StageEnv` never imports the Stage Bank, which builds its
states by playing envs; :func:`register_state_source` replaces it in this process.

:func:`register_envs` registers ``bat/Plan-v0`` .. ``bat/Submit-v0`` and ``bat/E2E-v0``
with Gymnasium: a StageEnv wrapped in the rubric reward (``rubric_reward=False`` turns
it off). It runs when Gymnasium is imported (through the ``.pth`` hook) and when
``bat_gym`` is imported, in every process, spawned workers included.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import BenchmarkNotFound
from bat_gym.core.plugins import Expect, Registry

if TYPE_CHECKING:
    from bat_gym.benchmark import Benchmark
    from bat_gym.core.sandbox.requirements import SandboxRequirements

__all__ = [
    "BENCHMARKS",
    "STATE_SOURCES",
    "installed_requirements",
    "STAGE_ENV_NAMES",
    "register_benchmark",
    "unregister_benchmark",
    "list_benchmarks",
    "get_benchmark",
    "default_benchmark_name",
    "register_envs",
    "env_ids",
    "state_source",
    "register_state_source",
]

STAGE_ENV_NAMES = ("Plan", "Setup", "Validate", "Infer", "Submit", "E2E")
ENV_NAMESPACE = "bat"

StateResolver = Callable[[Any, "Benchmark"], Any]


def _spelling(name: str) -> str:
    """A name as users may spell it: case and ``-`` versus ``_`` do not matter."""
    return name.strip().lower().replace("-", "_")


BENCHMARKS: Registry[Benchmark] = Registry(
    "bat_gym.benchmarks",
    expect=Expect("benchmark", "bat_gym.benchmark:Benchmark", factory=True, self_name="spec.name"),
    not_found=BenchmarkNotFound,
    spelling=_spelling,
)
"""The benchmarks, by name: registered in this process or installed (entry points)."""


def register_benchmark(name: str, benchmark: Benchmark | Callable[[], Benchmark] | str) -> None:
    """Make a benchmark available under ``name``.

    Args:
        name: the name users pass as ``benchmark=``.
        benchmark: an instance, a zero-argument factory, or a ``"module:attr"`` string
            naming either (imported on first use).
    """
    BENCHMARKS.register(name, benchmark)


def unregister_benchmark(name: str) -> None:
    """Forget a benchmark registered in this process (entry points come back on discovery)."""
    BENCHMARKS.unregister(name)


def list_benchmarks() -> list[str]:
    """Names of every registered or installed benchmark."""
    return list(BENCHMARKS)


def get_benchmark(name: str | None = None) -> Benchmark:
    """Load a benchmark by name (``None``: the default benchmark).

    Names match regardless of case and of ``-`` versus ``_``: ``medbench-lite``,
    ``MedBench-Lite`` and ``medbench_lite`` are one benchmark.

    Raises:
        BenchmarkNotFound: naming the installed benchmarks and close matches.
        PluginError: what the name resolves to is not a benchmark, or one that calls
            itself by another name.
    """
    return BENCHMARKS[name or default_benchmark_name()]


def default_benchmark_name() -> str:
    """``BAT_GYM_BENCHMARK``, else the installed benchmark with the highest priority."""
    chosen = os.environ.get("BAT_GYM_BENCHMARK")
    if chosen:
        return chosen
    priorities = {}
    for name in list_benchmarks():
        try:
            priorities[name] = get_benchmark(name).spec.default_priority
        except Exception as exc:  # one broken plugin must not hide the others
            warnings.warn(
                f"skipping benchmark {name!r} when choosing the default: {exc}", stacklevel=2
            )
    if not priorities:
        raise BenchmarkNotFound("<default>", list_benchmarks(), group=BENCHMARKS.group)
    return max(priorities, key=lambda n: (priorities[n], n))


def env_ids() -> list[str]:
    """The registered ``bat/*`` env ids."""
    return [f"{ENV_NAMESPACE}/{name}-v0" for name in STAGE_ENV_NAMES]


def register_envs() -> None:
    """Register the ``bat/*`` ids with Gymnasium (idempotent, imports no benchmark)."""
    import gymnasium as gym
    from gymnasium.envs.registration import WrapperSpec

    # Applied after Gymnasium's TimeLimit, so a max_episode_steps truncation is scored.
    verdict = WrapperSpec(
        "TruncationVerdict", "bat_gym.rubrics.verifier.reward:TruncationVerdict", kwargs={}
    )
    for name, env_id in zip(STAGE_ENV_NAMES, env_ids(), strict=True):
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="bat_gym.rubrics.verifier.reward:make_env",
                kwargs={"stage": name},
                disable_env_checker=False,
                additional_wrappers=(verdict,),
            )


STATE_SOURCES: Registry[StateResolver] = Registry(
    "bat_gym.state_sources", expect=Expect("state source")
)
"""The state resolvers, by name; envs use the one named ``default``."""


def register_state_source(resolver: StateResolver | str | None) -> None:
    """Replace how envs resolve their ``states=`` argument (None restores the default).

    Args:
        resolver: ``resolver(states, benchmark)`` returning a
            :class:`~bat_gym.bank.StateSource`, where ``states`` is the env's argument
            (None, a bank directory, or a source); or a ``"module:attr"`` naming one.
    """
    if resolver is None:
        STATE_SOURCES.unregister("default")
    else:
        STATE_SOURCES.register("default", resolver)


def state_source(states: Any, benchmark: Benchmark) -> Any:
    """The state source an env reads, given its ``states=`` argument and benchmark.

    By default (:func:`bat_gym.bank.state_source`): None gives the benchmark's default
    states (the default grid, each teacher trajectory built on first use and cached), a
    path the Stage Bank there, and a source is used as it is.
    """
    return STATE_SOURCES["default"](states, benchmark)


def installed_requirements() -> SandboxRequirements:
    """The union of every installed benchmark's sandbox requirements (what CI builds the image of).

    A benchmark that fails to load is left out with a warning.
    """
    from bat_gym.core.sandbox.requirements import DEFAULT_REQUIREMENTS, SandboxRequirements

    found = []
    for name in list_benchmarks():
        try:
            found.append(get_benchmark(name).sandbox_requirements())
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not stop the rest
            warnings.warn(
                f"benchmark {name!r} left out of the sandbox requirements: {exc}", stacklevel=2
            )
    return SandboxRequirements.union([DEFAULT_REQUIREMENTS, *found])
