"""bat_gym: staged benchmarks as Gymnasium environments for long-horizon LLM agents."""

__version__ = "0.1.0"
