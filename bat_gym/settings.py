"""How a run makes its envs: one typed model instead of loose ``gym.make`` keyword dicts.

The trainers and the command line describe an env the same way: which benchmark, which
states, which sandbox backend, which budget overrides and sandbox options. A typo in a
key fails when the settings are made, not when the first sandbox starts.

>>> EnvSettings(bank="banks/med", budgets={"max_turns": 3}).budgets
{'max_turns': 3}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bat_gym.core.spec import Budgets

__all__ = ["EnvSettings"]


class EnvSettings(BaseModel):
    """The keyword arguments of ``gym.make("bat/<stage>-v0", ...)``, typed.

    :meth:`gym_kwargs` turns them into what :class:`~bat_gym.env.StageEnv` takes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str | None = Field(
        None, description="Registered benchmark name (None: the installed default)."
    )
    bank: str | None = Field(
        None, description="Stage Bank directory (None: the benchmark's default states)."
    )
    track: str | None = Field(None, description="Only states of this track (None: every track).")
    backend: str = Field(
        "local", description="Sandbox backend, a name in bat_gym.core.sandbox.BACKENDS."
    )
    protocol: str = Field(
        "hermes", description="How tool calls are written (bat_gym.core.protocol)."
    )
    budgets: dict[str, int | float] = Field(
        default_factory=dict,
        description="Overrides of the benchmark's per-episode budgets (bat_gym.core.spec.Budgets "
        "fields, e.g. max_turns in assistant messages, tool_timeout_s in seconds).",
    )
    sandbox_options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the sandbox constructor."
    )

    @field_validator("budgets")
    @classmethod
    def _known_budgets(cls, value: dict[str, int | float]) -> dict[str, int | float]:
        unknown = sorted(set(value) - set(Budgets.model_fields))
        if unknown:
            raise ValueError(
                f"no budget named {', '.join(unknown)}; use {', '.join(Budgets.model_fields)}"
            )
        return value

    def gym_kwargs(self) -> dict[str, Any]:
        """The ``gym.make`` keyword arguments; only the settings given, budgets resolved.

        Budget overrides are applied to the benchmark's own budgets (looked up in the
        registry), so an override of one budget keeps the others.
        """
        kwargs: dict[str, Any] = {"backend": self.backend}
        if self.benchmark:
            kwargs["benchmark"] = self.benchmark
        if self.bank:
            kwargs["states"] = self.bank
        if self.track is not None:
            kwargs["track"] = self.track
        if self.protocol != "hermes":
            kwargs["protocol"] = self.protocol
        if self.sandbox_options:
            kwargs["sandbox_options"] = dict(self.sandbox_options)
        if self.budgets:
            from bat_gym.catalog import get_benchmark

            base = get_benchmark(self.benchmark).spec.budgets
            kwargs["budgets"] = Budgets(**{**base.model_dump(), **self.budgets})
        return kwargs
