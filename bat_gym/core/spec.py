"""Pydantic models that describe a staged benchmark: the one source of truth for schemas.

A benchmark B = (S, C, V): ordered stages S, a rubric contract per stage (C, referenced
here by id and digest), and a verifier V. These models are data only; behaviour lives
in :class:`bat_gym.benchmark.Benchmark`. Load spec files with :func:`load_model`, which
turns every validation problem into one :class:`~bat_gym.core.errors.SpecError` naming the
file, the field path and what was expected.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bat_gym.core.errors import SpecError, StageNotFound, TrackNotFound

# libyaml's loader where PyYAML was built with it: a contract loads several times faster.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

__all__ = [
    "E2E",
    "Focus",
    "Outcome",
    "Stage",
    "Track",
    "Budgets",
    "SeedRange",
    "Splits",
    "ContractRef",
    "BenchmarkSpec",
    "Task",
    "StageState",
    "first_problem",
    "load_model",
]

E2E = "E2E"
Focus = str
"""A stage id (``"S1"`` .. ``"S5"`` in the reference benchmarks) or ``"E2E"``."""
Outcome = Literal["success", "recovery", "failure"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Stage(BaseModel):
    """One stage of a staged benchmark.

    ``name`` is what env ids use (``bat/Validate-v0``); ``skill`` is the public stage
    skill shown in the prompt of that stage's envs: what a careful engineer does here
    and what evidence the contract expects, never a task's answer.
    """

    model_config = _STRICT

    id: str = Field(pattern=r"^S[1-9][0-9]*$", description="Stage id, S1 first.")
    name: str = Field(
        pattern=r"^[A-Z][A-Za-z0-9]*$",
        description="Capitalized name; `bat/<name>-v0` serves the stage when the name is one "
        "of the registered env names (Plan, Setup, Validate, Infer, Submit). Any stage is "
        "also reachable by id: `gym.make('bat/E2E-v0', benchmark=..., stage='S1')`.",
    )
    weight: float = Field(ge=0, le=1, description="Agentic weight of the stage.")
    skill: str = Field(
        min_length=1, description="Public skill text shown to the agent at this stage."
    )
    artifacts: tuple[str, ...] = Field(
        (), description="Workspace paths the stage is expected to write."
    )


class Track(BaseModel):
    """A family of tasks sharing inputs, outputs and a task metric."""

    model_config = _STRICT

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Track name, e.g. units.")
    metric: str = Field(min_length=1, description="Name of the task metric.")
    description: str = Field("", description="What the track's tasks ask, for people.")


class Budgets(BaseModel):
    """Per-episode limits; running out of any truncates the episode.

    Defaults are the reference runtime's.
    """

    model_config = _STRICT

    max_turns: int = Field(24, ge=1, description="Assistant messages per episode.")
    max_tool_calls: int = Field(23, ge=0, description="Tool calls per episode.")
    max_response_tokens: int = Field(
        16_384, ge=1, description="Cumulative response tokens, when counts are supplied."
    )
    max_observation_chars: int = Field(
        2048, ge=64, description="Characters of one tool result shown to the agent."
    )
    tool_timeout_s: float = Field(
        120.0, gt=0, description="Wall-clock limit of one tool call, seconds."
    )
    max_prompt_chars: int = Field(
        16_384, ge=256, description="Characters of prompt history kept at reset."
    )


class SeedRange(BaseModel):
    """Half-open integer range ``[start, stop)`` of generator seeds."""

    model_config = _STRICT

    start: int = Field(ge=0)
    stop: int

    @model_validator(mode="after")
    def _nonempty(self) -> SeedRange:
        if self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be greater than start ({self.start})")
        return self

    def __contains__(self, seed: int) -> bool:
        return self.start <= seed < self.stop

    def overlaps(self, other: SeedRange) -> bool:
        """True if the two ranges share a seed."""
        return self.start < other.stop and other.start < self.stop


class Splits(BaseModel):
    """Which seeds may feed training (the Stage Bank) and which are held out."""

    model_config = _STRICT

    train: SeedRange
    heldout: SeedRange
    heldout_repeats: int = Field(10, ge=1, description="Held-out tasks per track.")

    @model_validator(mode="after")
    def _disjoint(self) -> Splits:
        if self.train.overlaps(self.heldout):
            raise ValueError(f"train seeds {self.train} and held-out seeds {self.heldout} overlap")
        if self.heldout.stop - self.heldout.start < self.heldout_repeats:
            raise ValueError("held-out seed range is smaller than heldout_repeats")
        return self


class ContractRef(BaseModel):
    """A pointer to a rubric contract, pinned by the sha256 of its canonical form."""

    model_config = _STRICT

    id: str
    version: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BenchmarkSpec(BaseModel):
    """Everything a staged benchmark declares, as data."""

    model_config = _STRICT

    name: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        description="The name the benchmark is registered under (its entry point's name).",
    )
    version: str = Field(description="Part of every task id: bump it when tasks change.")
    description: str = Field("", description="What the benchmark is, for people.")
    stages: tuple[Stage, ...] = Field(
        min_length=1, description="The stages in order, ids S1..SN, names unique."
    )
    tracks: tuple[Track, ...] = Field(min_length=1, description="The task families.")
    budgets: Budgets = Field(Budgets(), description="Per-episode limits.")
    splits: Splits = Field(description="Training and held-out seeds.")
    task_weight: float = Field(
        0.5, ge=0, le=1, description="overall = task_weight*task + (1-task_weight)*agentic."
    )
    default_priority: int = Field(
        0, description="The installed benchmark with the highest priority is the default."
    )

    @field_validator("stages")
    @classmethod
    def _ordered(cls, stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
        ids = [s.id for s in stages]
        if ids != [f"S{i}" for i in range(1, len(ids) + 1)]:
            raise ValueError(f"stage ids must be S1..S{len(ids)} in order, got {ids}")
        names = [s.name for s in stages]
        if len(set(names)) != len(names) or E2E in names:
            raise ValueError(f"stage names must be unique and not {E2E!r}, got {names}")
        return stages

    @property
    def focuses(self) -> tuple[str, ...]:
        """Every focus an env can have: each stage id, then ``E2E``."""
        return (*(s.id for s in self.stages), E2E)

    def stage(self, key: str) -> Stage:
        """Look a stage up by id (``S3``) or name (``Validate``, case-insensitive)."""
        for s in self.stages:
            if key == s.id or key.lower() == s.name.lower():
                return s
        raise StageNotFound(
            key, [s.id for s in self.stages] + [s.name for s in self.stages] + [E2E]
        )

    def focus(self, key: str) -> str:
        """Normalize a stage id, stage name or ``E2E`` to a focus."""
        if key.upper() == E2E:
            return E2E
        return self.stage(key).id

    def track(self, name: str) -> Track:
        """Look a track up by name."""
        for t in self.tracks:
            if t.name == name:
                return t
        raise TrackNotFound(name, [t.name for t in self.tracks])


class Task(BaseModel):
    """One concrete task. Its private answers never enter this model or any sandbox."""

    model_config = _STRICT

    task_id: str = Field(description="Opaque id; reveals neither seed nor split.")
    benchmark: str
    track: str
    seed: int
    split: Literal["train", "heldout"]
    tier: int = Field(0, ge=0, description="Difficulty or size tier; 0 is the reference size.")
    card: str = Field(description="The task text shown to the agent.")
    params: dict[str, Any] = Field(default_factory=dict, description="Public generator parameters.")


class StageState(BaseModel):
    """A Stage Bank row: a replayable start state for one env episode.

    The workspace at the stage boundary is the snapshot ``snapshot`` (a content digest
    in the bank's blob store); ``messages`` is the prompt (system, user, and the earlier
    stages' turns); ``contract`` pins the rubric the episode is scored against. For a
    benchmark with a service (:mod:`bat_gym.core.service`), ``service`` is the digest of the
    service's state at the boundary, restored with the workspace.
    """

    model_config = _STRICT

    state_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    benchmark: str
    benchmark_version: str
    focus: str
    track: str
    outcome: Outcome = "success"
    task_id: str
    messages: tuple[dict[str, Any], ...] = Field(min_length=1)
    snapshot: str = Field(pattern=r"^[0-9a-f]{64}$")
    service: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="Digest of the benchmark service's state (bat_gym.core.service); None: none.",
    )
    contract: ContractRef | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)


M = TypeVar("M", bound=BaseModel)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def first_problem(exc: ValidationError) -> str:
    """A validation error's first problem as ``field.path: message``, for one-line errors.

    >>> from pydantic import BaseModel
    >>> class M(BaseModel):
    ...     n: int
    >>> try:
    ...     M.model_validate({})
    ... except ValidationError as exc:
    ...     print(first_problem(exc))
    n: Field required
    """
    first = exc.errors()[0]
    return f"{_loc(first['loc']) or '<root>'}: {first['msg']}"


def load_model(
    model: type[M], source: str | Path | dict[str, Any], *, origin: str | None = None
) -> M:
    """Validate a YAML/JSON file (or an already-parsed dict) against ``model``.

    Raises:
        SpecError: naming the file, each bad field path, and what was expected.
    """
    where = origin or (str(source) if not isinstance(source, dict) else "<dict>")
    if isinstance(source, dict):
        data: Any = source
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(where, [("", f"cannot read the file: {exc.strerror}")]) from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.load(text, _YAML_LOADER)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            msg = re.sub(r"\s+", " ", str(getattr(exc, "problem", None) or exc))
            raise SpecError(
                where,
                [("", f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}{at}: {msg}")],
            ) from None
    if not isinstance(data, dict):
        raise SpecError(
            where, [("", f"expected a mapping at the top level, got {type(data).__name__}")]
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [(_loc(e["loc"]), e["msg"]) for e in exc.errors()]
        raise SpecError(where, problems) from None
