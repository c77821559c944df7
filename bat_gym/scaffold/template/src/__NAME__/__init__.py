"""__NAME__: a staged benchmark for bat_gym, scaffolded by ``bat-gym new-benchmark``."""

from __NAME__.bench import __CLASS__

__all__ = ["__CLASS__", "benchmark"]


def benchmark() -> __CLASS__:
    """The ``bat_gym.benchmarks`` entry point named in pyproject.toml."""
    return __CLASS__()
