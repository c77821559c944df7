"""Target-stage selection: which stage the next RL round trains (the S-target pool).

Selection reads a :class:`~bat_gym.curriculum.gate.GateDecision` (aggregate stage scores and
their changes, nothing else from evaluation) and returns a stage id. It is separate
from promotion: the gate decides which checkpoint the next round starts from, the
selector decides what that round practises.

Three selectors ship with bat_gym, registered in :data:`SELECTORS` (entry point group
``bat_gym.selectors``, where a package adds its own :class:`TargetSelector`):

* ``"paper"`` (:class:`PaperSelector`, the default): the rule of the paper.
* ``"deficit"`` (:class:`DeficitSelector`): the stage with the largest weighted
  shortfall ``w_s * (1 - score_s)``.
* ``"progress"`` (:class:`ProgressSelector`): a bandit over stages that favours the
  stage whose score moved most when it was last trained.

Common rules: a stage whose score is null is never selected (missing evidence is not
a low score); ties go to the earlier stage (``S1`` before ``S2``), so routing is
deterministic; scores are compared after rounding to 12 decimals, so float noise
(``0.1 + 0.2`` vs ``0.3``) is a tie rather than a preference.

>>> paper_target({"S1": 0.70, "S2": 0.55, "S3": 0.20, "S4": 0.45, "S5": 0.60})
'S3'
>>> paper_target({"S3": 0.6, "S4": 0.5}, regressions={"S3": 0.04, "S4": 0.12}, held=True)
'S4'
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from bat_gym.core.errors import BatGymError, ConfigError, SelectorNotFound
from bat_gym.core.plugins import Expect, Registry
from bat_gym.core.spec import BenchmarkSpec
from bat_gym.curriculum.gate import GateDecision, stage_order

__all__ = [
    "DeficitSelector",
    "NoTargetStage",
    "PaperSelector",
    "ProgressSelector",
    "SELECTORS",
    "TargetSelector",
    "make_selector",
    "paper_target",
]

_STATE_VERSION = 1
_DECIMALS = 12


class NoTargetStage(BatGymError, ValueError):
    """No stage can be selected: every stage score is null (or unweighted).

    Attributes:
        stages: the stage ids that were offered.
    """

    def __init__(self, stages: list[str]) -> None:
        self.stages = stages
        super().__init__(
            f"no stage has a score to select on (offered: {stages or 'none'}); "
            "evaluate with the stage verdicts enabled"
        )


def _argbest(values: Mapping[str, float], *, largest: bool) -> str:
    """The stage with the largest (or smallest) value; ties go to the earlier stage."""
    if not values:
        raise NoTargetStage([])
    sign = -1.0 if largest else 1.0
    return min(values, key=lambda s: (sign * round(values[s], _DECIMALS), stage_order(s)))


def _scored(scores: Mapping[str, float | None]) -> dict[str, float]:
    return {s: v for s, v in scores.items() if v is not None}


def paper_target(
    candidate: Mapping[str, float | None],
    *,
    regressions: Mapping[str, float | None] | None = None,
    held: bool = False,
) -> str:
    """The paper's target rule.

    ``target = argmin_s candidate[s]``, except after a hold with some positive
    regression: then ``target = argmax_s regression[s]``, where
    ``regression[s] = baseline[s] - candidate[s]``. Ties go to the earlier stage.

    Args:
        candidate: the candidate's stage scores in [0, 1], null where unscored.
        regressions: baseline minus candidate per stage (only read when ``held``).
        held: the gate did not promote the candidate (hold or catastrophic).

    Returns:
        The selected stage id.

    Raises:
        NoTargetStage: every candidate stage score is null.
    """
    scored = _scored(candidate)
    if not scored:
        raise NoTargetStage(sorted(candidate, key=stage_order))
    if held and regressions:
        # Only stages the candidate still scores may be corrected towards.
        positive = {
            s: r for s, r in _scored(regressions).items() if s in scored and round(r, _DECIMALS) > 0
        }
        if positive:
            return _argbest(positive, largest=True)
    return _argbest(scored, largest=False)


class TargetSelector(ABC):
    """Picks the next round's target stage from the last gate decision.

    Subclasses implement :meth:`select`; stateful ones extend :meth:`state_dict` and
    :meth:`load_state_dict` so an outer loop that restarts continues with the same
    choices.
    """

    name: ClassVar[str]
    needs_spec: ClassVar[bool] = False
    """Whether :meth:`create` reads a benchmark's spec (``bat-gym gate`` then loads one)."""

    @abstractmethod
    def select(self, decision: GateDecision) -> str:
        """Return the stage id the next round targets.

        Raises:
            NoTargetStage: no stage has a score to select on.
        """

    @classmethod
    def create(cls, *, spec: BenchmarkSpec | None = None, seed: int = 0) -> TargetSelector:
        """The selector :func:`make_selector` builds, given a benchmark's spec and a seed.

        Default: ``cls()``. Override where the selector reads either.
        """
        return cls()

    def state_dict(self) -> dict[str, Any]:
        """Where the selector stands, as plain JSON-able data."""
        return {"version": _STATE_VERSION, "selector": self.name}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of the same selector.

        Raises:
            ValueError: the state is of another version or another selector.
        """
        if state.get("version") != _STATE_VERSION or state.get("selector") != self.name:
            raise ConfigError(
                f"expected a {self.name!r} selector state of version {_STATE_VERSION}, got "
                f"selector {state.get('selector')!r} version {state.get('version')!r}"
            )


class PaperSelector(TargetSelector):
    """The paper's rule (:func:`paper_target`) on a gate decision; stateless."""

    name = "paper"

    def select(self, decision: GateDecision) -> str:
        """Lowest candidate stage; after a hold, the largest positive regression."""
        return paper_target(
            decision.candidate_stages,
            regressions=decision.regressions,
            held=not decision.promoted,
        )


class DeficitSelector(TargetSelector):
    """Weight-aware deficit: ``target = argmax_s w_s * (1 - score_s)``; stateless.

    The deficit is what the stage leaves on the table of the agentic score, so a heavy
    stage at 0.6 (S3, weight 0.35: deficit 0.14) outranks a light one at 0.3 (S5,
    weight 0.10: deficit 0.07), where the paper's rule would pick S5.

    The scores are those of the checkpoint the next round starts from: the
    candidate's after a promotion, the baseline's after a hold (the candidate is
    discarded then). Stages without a weight or with a null score are not eligible.

    Args:
        weights: stage id -> agentic weight in [0, 1].
    """

    name = "deficit"
    needs_spec = True

    def __init__(self, weights: Mapping[str, float]) -> None:
        bad = {s: w for s, w in weights.items() if not 0.0 <= w <= 1.0}
        if bad:
            raise ConfigError(f"expected stage weights in [0, 1], got {bad}")
        self.weights = dict(weights)

    @classmethod
    def from_spec(cls, spec: BenchmarkSpec) -> DeficitSelector:
        """Use the agentic weights the benchmark declares for its stages."""
        return cls({s.id: s.weight for s in spec.stages})

    @classmethod
    def create(cls, *, spec: BenchmarkSpec | None = None, seed: int = 0) -> DeficitSelector:
        """The deficit of ``spec``'s stage weights.

        Raises:
            ConfigError: no spec was given.
        """
        if spec is None:
            raise ConfigError("the 'deficit' selector needs stage weights: pass spec=")
        return cls.from_spec(spec)

    def select(self, decision: GateDecision) -> str:
        """The eligible stage with the largest weighted deficit."""
        return self.target(
            decision.candidate_stages if decision.promoted else decision.baseline_stages
        )

    def target(self, scores: Mapping[str, float | None]) -> str:
        """The stage of ``scores`` with the largest weighted deficit ``w_s * (1 - score_s)``.

        Raises:
            NoTargetStage: no stage of ``scores`` has both a weight and a score.
        """
        scored = {s: v for s, v in _scored(scores).items() if s in self.weights}
        if not scored:
            raise NoTargetStage(sorted(scores, key=stage_order))
        return _argbest({s: self.weights[s] * (1.0 - v) for s, v in scored.items()}, largest=True)


class ProgressSelector(TargetSelector):
    """A learning-progress bandit: train the stage that moved most when last trained.

    Each stage is an arm. A round that targeted stage ``a`` is judged by the gate
    that follows it, which measured ``delta_a = candidate_a - baseline_a`` (minus the
    regression). Its absolute value is that round's absolute learning progress: a
    stage that moved, up or down, is one where training currently bites, while a
    stage that stays flat is either mastered or out of reach.

    Per stage ``s`` the selector keeps ``n_s`` (rounds that targeted it and were
    judged) and ``LP_s``, an exponential moving average of ``|delta_s|``, so the
    estimate follows a learner whose progress changes over rounds::

        LP_a <- |delta_a|                             on a's first observation
        LP_a <- (1 - beta) * LP_a + beta * |delta_a|  afterwards
        U_s   = LP_s + c * sqrt(ln(t) / n_s),         t = sum_s n_s
        target = argmax_s U_s                         (ties: earlier stage)

    Stages never tried (``n_s = 0``) come first, earliest first; ``U_s`` is the UCB1
    bonus, shrinking as a stage is tried more. With probability ``epsilon`` the
    selector instead picks a uniformly random eligible stage, drawn from a generator
    seeded by ``(seed, round)``: choices are a function of the seed and the decisions
    seen, and a resumed selector draws what an uninterrupted one would. A round whose
    delta is null (a score missing on either side) counts as tried, with no
    progress recorded. Eligible stages are those the candidate scores.

    Args:
        seed: seed of the exploration draws.
        exploration: ``c``, the UCB coefficient, in score units: progress per round is
            a few hundredths, so a bonus of that order keeps exploration alive.
        epsilon: probability of a uniformly random stage, in [0, 1].
        smoothing: ``beta`` in (0, 1], weight of the newest observation.
    """

    name = "progress"

    def __init__(
        self,
        *,
        seed: int = 0,
        exploration: float = 0.05,
        epsilon: float = 0.1,
        smoothing: float = 0.5,
    ) -> None:
        if exploration < 0:
            raise ConfigError(f"expected exploration >= 0, got {exploration}")
        if not 0.0 <= epsilon <= 1.0:
            raise ConfigError(f"expected epsilon in [0, 1], got {epsilon}")
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError(f"expected smoothing in (0, 1], got {smoothing}")
        self.seed = seed
        self.exploration = exploration
        self.epsilon = epsilon
        self.smoothing = smoothing
        self.rounds = 0  # select() calls so far
        self.last: str | None = None  # the stage the round now being judged targeted
        self.pulls: dict[str, int] = {}
        self.progress: dict[str, float] = {}

    @classmethod
    def create(cls, *, spec: BenchmarkSpec | None = None, seed: int = 0) -> ProgressSelector:
        """A bandit drawing with ``seed``, at the default settings."""
        return cls(seed=seed)

    def _observe(self, decision: GateDecision) -> None:
        a = self.last
        if a is None:
            return
        self.pulls[a] = self.pulls.get(a, 0) + 1
        regression = decision.regressions.get(a)
        if regression is None:
            return
        alp = abs(regression)  # |delta_a| = |candidate_a - baseline_a|
        if a not in self.progress:
            self.progress[a] = alp
        else:
            self.progress[a] = (1 - self.smoothing) * self.progress[a] + self.smoothing * alp

    def _ucb(self, stage: str, t: int) -> float:
        n = self.pulls[stage]
        # U_s = LP_s + c * sqrt(ln(t) / n_s)
        return self.progress.get(stage, 0.0) + self.exploration * math.sqrt(math.log(t) / n)

    def select(self, decision: GateDecision) -> str:
        """Record the judged round's progress, then pick the next stage."""
        eligible = sorted(_scored(decision.candidate_stages), key=stage_order)
        if not eligible:
            raise NoTargetStage(sorted(decision.candidate_stages, key=stage_order))
        self._observe(decision)
        rng = random.Random(f"{self.seed}:{self.rounds}")
        untried = [s for s in eligible if self.pulls.get(s, 0) == 0]
        if rng.random() < self.epsilon:
            target = rng.choice(eligible)
        elif untried:
            target = untried[0]
        else:
            t = sum(self.pulls.values())
            target = _argbest({s: self._ucb(s, t) for s in eligible}, largest=True)
        self.rounds += 1
        self.last = target
        return target

    def state_dict(self) -> dict[str, Any]:
        """Configuration, counters and estimates; no generator state is needed."""
        return {
            **super().state_dict(),
            "seed": self.seed,
            "exploration": self.exploration,
            "epsilon": self.epsilon,
            "smoothing": self.smoothing,
            "rounds": self.rounds,
            "last": self.last,
            "pulls": dict(self.pulls),
            "progress": dict(self.progress),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; its configuration replaces this one's."""
        super().load_state_dict(state)
        restored = ProgressSelector(
            seed=int(state["seed"]),
            exploration=float(state["exploration"]),
            epsilon=float(state["epsilon"]),
            smoothing=float(state["smoothing"]),
        )
        self.seed, self.exploration = restored.seed, restored.exploration
        self.epsilon, self.smoothing = restored.epsilon, restored.smoothing
        self.rounds = int(state["rounds"])
        self.last = state["last"]
        self.pulls = {s: int(n) for s, n in state["pulls"].items()}
        self.progress = {s: float(v) for s, v in state["progress"].items()}


SELECTORS: Registry[type[TargetSelector]] = Registry(
    "bat_gym.selectors",
    expect=Expect("selector", TargetSelector, subclass=True, self_name="name"),
    not_found=SelectorNotFound,
)
"""The target selectors, by name: what :func:`make_selector`, ``bat-gym gate --selector``
and ``bat-gym loop --selector`` accept (entry point group ``bat_gym.selectors``)."""


def make_selector(
    name: str = "paper", *, spec: BenchmarkSpec | None = None, seed: int = 0
) -> TargetSelector:
    """Build a selector by name (one of :data:`SELECTORS`), through its :meth:`~TargetSelector.create`.

    Args:
        name: the selector; ``"paper"`` by default.
        spec: the benchmark whose stage weights a selector may use (``"deficit"``
            needs it).
        seed: seed of a selector's random draws (``"progress"`` explores with it).

    Raises:
        SelectorNotFound: an unknown name (a ``ValueError``).
        ConfigError: the selector needs what it was not given (``"deficit"`` without a
            spec).
    """
    return SELECTORS[name].create(spec=spec, seed=seed)
