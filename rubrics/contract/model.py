"""Rubric contracts: versioned, digest-pinned data that say how a stage is scored.

A stage contract lists checklist items (a registered check, its arguments, a weight
and the evidence kinds a pass must rest on), how items become a stage score (an
equal-weight ``mean``, or AutoMedBench-style graded ``levels``), and gates that cap the
reward. An item marked ``guard`` earns no credit; its failure zeroes the stage, so
leaving earlier files alone is required without being rewarded. An E2E contract composes stage contracts by id and version, plus the task
metric. A contract's identity is the sha256 of its canonical JSON, so a Stage Bank row
pins exactly the rubric its episodes are scored against, and a library refuses to hand
out a contract whose digest differs.

Load one file with :func:`load_contract`; load a directory with
:meth:`ContractLibrary.from_dir`; the contracts of the reference stages ship in
``bat_gym/rubrics/contract`` (:meth:`ContractLibrary.reference`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bat_gym.core.errors import CheckNotFound, ContractNotFound, RubricContractError
from bat_gym.core.spec import E2E, ContractRef, load_model
from bat_gym.rubrics.contract.checks import check_evidence, get_check, validate_args
from bat_gym.rubrics.contract.context import EvidenceKind

__all__ = [
    "GateName",
    "RubricItem",
    "Level",
    "Component",
    "RubricContract",
    "load_contract",
    "ContractLibrary",
    "REFERENCE_DIR",
]

REFERENCE_DIR = Path(__file__).parent
"""The contracts of the reference stages (S1 plan .. S5 submit, and E2E)."""

GateName = Literal["successful_change"]
"""``successful_change``: no credit unless a tool call exited 0 and changed the workspace."""

_STRICT = ConfigDict(extra="forbid", frozen=True)
_ID = r"^[a-z][a-z0-9_.-]*$"


class RubricItem(BaseModel):
    """One checklist item: a registered check applied with fixed arguments."""

    model_config = _STRICT

    id: str = Field(pattern=_ID, description="Unique within the contract, e.g. pilot_ran.")
    check: str = Field(description="A registered check name, e.g. receipt_valid.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the check, validated at load."
    )
    weight: float = Field(1.0, ge=0, description="Weight in a mean-aggregated stage score.")
    requires: tuple[EvidenceKind, ...] = Field(
        ("artifact",),
        description="Evidence kinds a pass must rest on (artifact, execution); a pass "
        "without them lowers the evidence completeness eta. Default: artifact, or none "
        "for a check registered with evidence='none'.",
    )
    guard: bool = Field(
        False,
        description="A precondition, not credit: left out of the score, but the stage "
        "scores 0 when it fails (e.g. earlier-stage files tampered with).",
    )
    scope: Literal["any", "stage"] = Field(
        "any",
        description="stage: scored only on the contract's own stage rows, skipped when an "
        "E2E contract composes it (e.g. earlier-stage files unchanged).",
    )
    description: str = Field("", description="What the item establishes, for people.")

    @model_validator(mode="before")
    @classmethod
    def _default_requires(cls, data: Any) -> Any:
        # A check that returns no evidence cannot meet the artifact default: its items
        # require nothing unless the contract says otherwise (refused below).
        if isinstance(data, dict) and "requires" not in data:
            try:
                if check_evidence(str(data.get("check"))) == "none":
                    return {**data, "requires": ()}
            except CheckNotFound:
                pass  # the check's own validator reports it
        return data

    @field_validator("requires")
    @classmethod
    def _requires_fit_check(
        cls, requires: tuple[str, ...], info: ValidationInfo
    ) -> tuple[str, ...]:
        name = info.data.get("check")
        if requires and name is not None and check_evidence(name) == "none":
            raise ValueError(
                f"check {name!r} returns no evidence (registered with evidence='none'), so "
                f"requires {list(requires)} could never be met; drop requires from this item"
            )
        return requires

    @field_validator("check")
    @classmethod
    def _known_check(cls, name: str) -> str:
        try:
            get_check(name)
        except CheckNotFound as exc:
            raise ValueError(str(exc)) from None
        return name

    @field_validator("args")
    @classmethod
    def _args_fit_check(cls, args: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("check")
        if name is None:  # the check itself was invalid; that error is reported
            return args
        try:
            validate_args(name, args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '<args>'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"does not fit check {name!r}: {problems}") from None
        return args


class Level(BaseModel):
    """A graded score: reached when every item it requires passes."""

    model_config = _STRICT

    score: float = Field(ge=0, le=1, description="The stage score at this level.")
    requires: tuple[str, ...] = Field((), description="Item ids that must all pass.")


class Component(BaseModel):
    """A stage contract composed into an E2E contract, pinned by id and version."""

    model_config = _STRICT

    contract: str = Field(pattern=_ID, description="The stage contract's id.")
    version: str = Field(min_length=1, description="The stage contract's version.")


class RubricContract(BaseModel):
    """How one focus (a stage, or E2E) is scored.

    Checked when the contract loads, besides each field:

    * item ids are unique, and every item's ``args`` fit its check;
    * a stage contract has at least one item that is not a guard, and no
      ``components`` or ``task_score``;
    * an E2E contract has ``components`` (distinct) and no items or levels of its own;
      the library must hold each component with the version it pins;
    * ``levels`` go with ``aggregation: levels`` only; their scores ascend, and each
      names credit items (not guards) of this contract.
    """

    model_config = _STRICT

    id: str = Field(pattern=_ID, description="Library-unique id, e.g. s3_validate.")
    version: str = Field(min_length=1, description="Bumped whenever scoring changes.")
    focus: str = Field(pattern=r"^(S[1-9]|E2E)$", description="S1..S9, or E2E.")
    description: str = Field("", description="What the contract scores, for people.")
    aggregation: Literal["mean", "levels"] = Field(
        "mean",
        description="mean: weighted mean of binary items; levels: the highest level "
        "whose required items all pass.",
    )
    items: tuple[RubricItem, ...] = Field((), description="The checklist.")
    levels: tuple[Level, ...] = Field(
        (), description="Graded scores for levels aggregation, e.g. 0 / 0.2 / 0.5 / 1.0."
    )
    gates: tuple[GateName, ...] = Field(
        (), description="Conditions without which the reward is capped at 0."
    )
    components: tuple[Component, ...] = Field(
        (), description="E2E only: the stage contracts composed, one per stage."
    )
    task_score: bool = Field(
        False,
        description="E2E only: combine the benchmark's task metric with the weighted stage "
        "mean (reward = tw*task + (1-tw)*stage mean, tw = the spec's task_weight).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RubricContract:
        ids = [i.id for i in self.items]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"item ids must be unique; repeated: {dupes}")
        if self.focus == E2E:
            if self.items or self.levels or not self.components:
                raise ValueError("an E2E contract has components and no items or levels of its own")
            names = [c.contract for c in self.components]
            if len(set(names)) != len(names):
                raise ValueError(f"components must be distinct, got {names}")
        else:
            if self.components or self.task_score:
                raise ValueError("components and task_score belong to E2E contracts only")
            if all(i.guard for i in self.items):
                raise ValueError("a stage contract needs at least one item that is not a guard")
        if self.aggregation == "levels":
            if not self.levels:
                raise ValueError("aggregation 'levels' needs levels")
            scores = [lv.score for lv in self.levels]
            if scores != sorted(set(scores)):
                raise ValueError(f"level scores must be distinct and ascending, got {scores}")
            credit = [i.id for i in self.items if not i.guard]
            for n, level in enumerate(self.levels):
                unknown = [i for i in level.requires if i not in credit]
                if unknown:
                    raise ValueError(
                        f"levels[{n}] requires {unknown}, which are not credit items of this "
                        f"contract ({credit}); guards apply to every level"
                    )
        elif self.levels:
            raise ValueError("levels are only used with aggregation 'levels'")
        return self

    @property
    def sha256(self) -> str:
        """sha256 of the canonical JSON (sorted keys, no spaces) of the validated contract.

        Computed on each access, never cached: ``model_copy(update=...)`` copies cached
        values, and a copy must not carry its original's digest.
        """
        canonical = json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def ref(self) -> ContractRef:
        """The pointer a Stage Bank row stores: id, version and digest."""
        return ContractRef(id=self.id, version=self.version, sha256=self.sha256)


def load_contract(path: str | Path) -> RubricContract:
    """Load and validate one contract file (YAML or JSON).

    Raises:
        SpecError: naming the file, and for each problem the field path (e.g.
            ``items[2].check``) and what was wrong; an unknown check lists the known ones.
    """
    return load_model(RubricContract, path)


class ContractLibrary:
    """Contracts by id; hands one out only when its digest matches the caller's pin.

    Args:
        contracts: the contracts; ids must be unique and every E2E component present.

    Raises:
        RubricContractError: an id appears twice, or a component is missing, has another
            version, or is not a stage contract.
    """

    def __init__(self, contracts: Iterable[RubricContract]) -> None:
        self._by_id: dict[str, RubricContract] = {}
        for c in contracts:
            if c.id in self._by_id:
                raise RubricContractError(c.id, "defined twice in one library")
            self._by_id[c.id] = c
        for c in self._by_id.values():
            for comp in c.components:
                self.component(comp)

    @classmethod
    def from_dir(cls, root: str | Path) -> ContractLibrary:
        """Load every ``*.yaml`` file of ``root`` (sorted by name)."""
        return cls(load_contract(p) for p in sorted(Path(root).glob("*.yaml")))

    @classmethod
    def reference(cls) -> ContractLibrary:
        """The contracts shipped for the reference stages (loaded once per process)."""
        return _reference_library()

    def __iter__(self) -> Iterator[RubricContract]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, contract_id: object) -> bool:
        return contract_id in self._by_id

    @property
    def ids(self) -> list[str]:
        """Contract ids, sorted."""
        return sorted(self._by_id)

    def by_id(self, contract_id: str) -> RubricContract:
        """The contract with this id, unpinned (for tools and authors, not for scoring).

        Raises:
            ContractNotFound: listing the ids held and close matches.
        """
        try:
            return self._by_id[contract_id]
        except KeyError:
            raise ContractNotFound(contract_id, list(self._by_id)) from None

    def get(self, ref: ContractRef) -> RubricContract:
        """The contract ``ref`` pins, refused unless version and sha256 match.

        Raises:
            ContractNotFound: no contract with ``ref.id``.
            RubricContractError: the library's contract has another version or digest;
                the message names both digests.
        """
        contract = self.by_id(ref.id)
        if contract.sha256 != ref.sha256 or contract.version != ref.version:
            raise RubricContractError(
                ref.id,
                f"the state pins version {ref.version} sha256 {ref.sha256}, but the library "
                f"holds version {contract.version} sha256 {contract.sha256}; refusing to score "
                "against a different rubric. Rebuild the Stage Bank with this library, or load "
                "the contract the state was built with.",
                expected=ref.sha256,
                actual=contract.sha256,
            )
        return contract

    def component(self, comp: Component) -> RubricContract:
        """The stage contract an E2E component names (id and version must match).

        Raises:
            RubricContractError: missing, another version, or not a stage contract.
        """
        held = self._by_id.get(comp.contract)
        if held is None:
            raise RubricContractError(
                comp.contract, "named as an E2E component but not in the library"
            )
        if held.version != comp.version:
            raise RubricContractError(
                comp.contract,
                f"an E2E component pins version {comp.version}, the library holds {held.version}",
            )
        if held.focus == E2E:
            raise RubricContractError(comp.contract, "an E2E contract cannot be a component")
        return held

    def for_focus(self, focus: str) -> RubricContract | None:
        """The one contract scoring ``focus``, or None if the library has none.

        Raises:
            RubricContractError: more than one contract has this focus.
        """
        found = [c for c in self._by_id.values() if c.focus == focus]
        if len(found) > 1:
            raise RubricContractError(
                found[1].id,
                f"focus {focus} is scored by several contracts: {[c.id for c in found]}",
            )
        return found[0] if found else None


@functools.cache
def _reference_library() -> ContractLibrary:
    return ContractLibrary.from_dir(REFERENCE_DIR)
