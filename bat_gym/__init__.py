"""bat_gym: staged benchmarks as Gymnasium environments for long-horizon LLM agents.

``import bat_gym`` is light: it registers the ``bat/*`` env ids and exposes the public
names below lazily, so torch and the sandboxes load only when used.
"""

from __future__ import annotations

from bat_gym.core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # environments
    "StageEnv": "bat_gym.env",
    "Completion": "bat_gym.core.completion",
    "UnicodeText": "bat_gym.core.textspace",
    # benchmarks and specs
    "Benchmark": "bat_gym.benchmark",
    "TeacherTurn": "bat_gym.benchmark",
    "BenchmarkSpec": "bat_gym.core.spec",
    "Stage": "bat_gym.core.spec",
    "Track": "bat_gym.core.spec",
    "Task": "bat_gym.core.spec",
    "StageState": "bat_gym.core.spec",
    "Budgets": "bat_gym.core.spec",
    "register_benchmark": "bat_gym.catalog",
    "get_benchmark": "bat_gym.catalog",
    "list_benchmarks": "bat_gym.catalog",
    # the Stage Bank and the curriculum
    "StageBank": "bat_gym.bank",
    "build_bank": "bat_gym.bank",
    "RoundSpec": "bat_gym.curriculum.rounds",
    "RLRow": "bat_gym.curriculum.rounds",
    "build_round": "bat_gym.curriculum.rounds",
    "StageCurriculum": "bat_gym.curriculum.wrapper",
    "CurriculumSampler": "bat_gym.curriculum.sampler",
    # sandboxes and tool calls
    "make_sandbox": "bat_gym.core.sandbox",
    "SandboxLimits": "bat_gym.core.sandbox",
    "ToolCall": "bat_gym.core.protocol",
    "get_protocol": "bat_gym.core.protocol",
    "ExecutionRecord": "bat_gym.core.record",
    # the root of every error bat_gym raises
    "BatGymError": "bat_gym.core.errors",
}

__all__ = ["__version__", *_EXPORTS]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, also=["__version__"])


def _register() -> None:
    from bat_gym.core.moved import install

    install()  # the module paths from before the folders by layer
    from bat_gym.catalog import register_envs

    register_envs()


_register()
