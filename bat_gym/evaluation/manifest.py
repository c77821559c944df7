"""``manifest.json`` of an evaluation: what reproduces every figure of its report.

Written by :func:`~bat_gym.evaluation.evaluate` after every invocation and read back by
the next one (its timing accumulates over a resumed run). The keys are the ones the file
has always had; :func:`read_manifest` checks them and names the first problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bat_gym.core.errors import BatGymError
from bat_gym.core.spec import first_problem

__all__ = ["BenchmarkIdentity", "EvalManifest", "ManifestCell", "Timing", "read_manifest"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class BenchmarkIdentity(BaseModel):
    """The benchmark evaluated: name, spec version and the digest of each contract."""

    model_config = _STRICT

    name: str = Field(description="The registered benchmark name.")
    version: str = Field(description="The benchmark's spec version.")
    contracts: dict[str, str] = Field(description="Contract id -> sha256 of the contract.")


class ManifestCell(BaseModel):
    """One cell of the run and the held-out task it played."""

    model_config = _STRICT

    track: str
    seed: int = Field(description="The held-out seed of the task.")
    repeat: int = Field(ge=0)
    task_id: str


class Timing(BaseModel):
    """The run's cost over every invocation (a resumed run adds to it)."""

    model_config = _STRICT

    started: str = Field(description="ISO 8601 start of the first invocation (UTC).")
    wall_s: float = Field(ge=0, description="Seconds of every invocation together.")
    invocations: int = Field(1, ge=1, description="Invocations of the run so far.")
    episode_wall_s_total: float | None = Field(
        None, ge=0, description="Seconds of every cell's episode together (workers overlap)."
    )


class EvalManifest(BaseModel):
    """An evaluation's ``manifest.json``."""

    model_config = _STRICT

    policy: dict[str, Any] = Field(description="The policy's name and identity (no secrets).")
    benchmark: BenchmarkIdentity
    cells: list[ManifestCell] = Field(description="Every cell, in the run's order.")
    settings: dict[str, Any] = Field(
        description="Protocol, backend, budgets and the evaluation config."
    )
    versions: dict[str, str] = Field(description="Python, platform and library versions.")
    timing: Timing

    def to_json(self) -> str:
        """The file's text: indented, sorted keys, as it has always been written."""
        data = self.model_dump(mode="json")
        return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def read_manifest(path: Path) -> EvalManifest:
    """Read and check an evaluation's ``manifest.json``.

    Raises:
        BatGymError: the file is missing, not JSON, or not a manifest (naming the first
            field that is wrong).
    """
    try:
        return EvalManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BatGymError(f"{path}: cannot read the evaluation manifest ({exc})") from exc
    except ValidationError as exc:
        raise BatGymError(
            f"{path} is not an evaluation manifest: {first_problem(exc)}; rerun the "
            "evaluation into a new --out directory"
        ) from exc
