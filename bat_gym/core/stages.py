"""The reference stage set: the five stages every reference benchmark is built on.

A staged pipeline benchmark plans (S1 Plan), sets up its pipeline (S2 Setup), validates
it on one case (S3 Validate, the stage that catches the traps and so weighs most), runs
it on every case (S4 Infer) and submits in the task's schema (S5 Submit). The names are
the ones the ``bat/<Name>-v0`` env ids serve; the weights are the agentic weights of
the BaT reference protocol; the artifacts are the files each stage leaves in the
workspace (receipts in ``validation/`` name the artifact and its sha256).

A suite gives its skills (and, where it differs, a stage's artifacts) and gets the
stages (:func:`reference_stages`); a package of fewer stages takes them one by one
(:func:`reference_stage`).

>>> [s.name for s in reference_stages({f"S{i}": "..." for i in range(1, 6)})]
['Plan', 'Setup', 'Validate', 'Infer', 'Submit']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bat_gym.core.errors import ConfigError
from bat_gym.core.spec import Stage

__all__ = [
    "REFERENCE_ARTIFACTS",
    "REFERENCE_STAGE_NAMES",
    "REFERENCE_WEIGHTS",
    "reference_stage",
    "reference_stages",
]

REFERENCE_STAGE_NAMES: tuple[str, ...] = ("Plan", "Setup", "Validate", "Infer", "Submit")
"""The stages in order; stage ``S<i>`` is the ``i``-th."""

REFERENCE_WEIGHTS: Mapping[str, float] = {
    "Plan": 0.25,
    "Setup": 0.15,
    "Validate": 0.35,
    "Infer": 0.15,
    "Submit": 0.10,
}
"""Agentic weight of each stage (sum 1); an E2E reward renormalizes over the stages it scores."""

REFERENCE_ARTIFACTS: Mapping[str, tuple[str, ...]] = {
    "Plan": ("plan/plan.md",),
    "Setup": ("setup/environment.json", "pipeline/infer.py"),
    "Validate": ("validation/pilot.csv", "validation/s3_validation.json"),
    "Infer": ("outputs/predictions.csv", "validation/s4_completion.json"),
    "Submit": ("outputs/submission.csv", "validation/s5_submission.json"),
}
"""Workspace paths each stage writes, by default (a suite may name its own)."""


def reference_stage(
    name: str,
    *,
    id: str,  # noqa: A002 - the Stage field's own name
    skill: str,
    artifacts: Sequence[str] | None = None,
    weight: float | None = None,
) -> Stage:
    """One reference stage under ``id``, with the suite's skill.

    Args:
        name: a name of :data:`REFERENCE_STAGE_NAMES`.
        id: the stage id in the suite (``S1`` first).
        skill: the public skill text shown at this stage.
        artifacts: the workspace paths the stage writes (default:
            :data:`REFERENCE_ARTIFACTS`).
        weight: the agentic weight (default: :data:`REFERENCE_WEIGHTS`).

    Raises:
        ConfigError: ``name`` is not a reference stage.
    """
    if name not in REFERENCE_WEIGHTS:
        raise ConfigError(
            f"{name!r} is not a reference stage; use one of {', '.join(REFERENCE_STAGE_NAMES)}"
        )
    return Stage(
        id=id,
        name=name,
        weight=REFERENCE_WEIGHTS[name] if weight is None else weight,
        skill=skill,
        artifacts=tuple(REFERENCE_ARTIFACTS[name] if artifacts is None else artifacts),
    )


def reference_stages(
    skills: Mapping[str, str], *, artifacts: Mapping[str, Sequence[str]] | None = None
) -> tuple[Stage, ...]:
    """The five reference stages ``S1``..``S5`` with the suite's skills.

    Args:
        skills: the skill text of each stage, by id (``"S1"``..``"S5"``).
        artifacts: a stage's artifacts where they differ from :data:`REFERENCE_ARTIFACTS`,
            by id.

    Raises:
        ConfigError: ``skills`` or ``artifacts`` name another stage id, or a skill is
            missing.
    """
    ids = [f"S{i}" for i in range(1, len(REFERENCE_STAGE_NAMES) + 1)]
    extra = (set(skills) | set(artifacts or {})) - set(ids)
    missing = [i for i in ids if i not in skills]
    if extra or missing:
        raise ConfigError(
            f"the reference stages are {', '.join(ids)}: give a skill for each "
            f"(missing: {missing or 'none'}) and no other ids (got: {sorted(extra) or 'none'})"
        )
    overrides = artifacts or {}
    return tuple(
        reference_stage(name, id=i, skill=skills[i], artifacts=overrides.get(i))
        for i, name in zip(ids, REFERENCE_STAGE_NAMES, strict=True)
    )
