"""Building a bank: the plan of tasks, the resumable journal, and the manifest.

:func:`build_bank` plans one job per task and outcome (and per surrogate), skips the
jobs already in the journal (``rows.partial.jsonl``, :class:`_Journal`), builds the
rest (:mod:`bat_gym.bank.tasks`), then gathers the journal's records in plan order
(:class:`_Tally`) into ``rows.jsonl`` and a manifest of counts and provenance.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from bat_gym.bank.demonstrate import ADMIT_MIN_SHARE
from bat_gym.bank.explain import admission_shares
from bat_gym.bank.gates import GATES
from bat_gym.bank.policy_teacher import POLICY_OUTCOMES, teacher_identity
from bat_gym.bank.states import SURROGATE
from bat_gym.bank.store import BANK_FORMAT, StageBank
from bat_gym.bank.tasks import SUCCESS_MIN_REWARD, Builder, Job, run_jobs
from bat_gym.benchmark import Benchmark
from bat_gym.core import progress
from bat_gym.core.errors import BankError, ConfigError
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import Outcome, StageState, load_model

if TYPE_CHECKING:
    from bat_gym.policies.base import Policy

__all__ = ["OUTCOMES", "Plan", "build_bank", "write_bank"]


OUTCOMES: tuple[str, ...] = get_args(Outcome)


def _task_key(track: str, seed: int, outcome: str) -> str:
    return f"{track}/{seed}/{outcome}"


def _surrogate_key(track: str, seed: int, reduction: dict[str, Any]) -> str:
    key = f"{track}/{seed}/{SURROGATE}/{reduction['max_cases']}"
    passes = reduction.get("validation_passes")
    return key if passes is None else f"{key}/v{passes}"


class _Journal:
    """``rows.partial.jsonl``: one line per finished task, appended and fsynced.

    The first line is a header naming the build; every later line is one task's
    record (its rows, or why it was rejected). A task's rows share one line, so a
    build killed mid-write leaves at most one torn last line, which is cut off on the
    next open: a half-written task is never admitted, and a rerun redoes it. Only the
    building process writes it (workers hand their records back).
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.done: dict[str, dict[str, Any]] = {}
        good = 0
        if path.exists():
            data = path.read_bytes()
            for line in data.split(b"\n")[:-1]:  # the part after the last newline is torn
                try:
                    record = json.loads(line)
                except ValueError:
                    break  # a torn line can only be the last written; stop at it
                if good == 0:
                    if record.get("header") != header:
                        raise BankError(
                            str(path),
                            f"an unfinished build of another kind is here ({record.get('header')}, "
                            f"this build is {header}); build into a fresh directory",
                        )
                else:
                    self.done[record["key"]] = record
                good += len(line) + 1
            if good < len(data):
                os.truncate(path, good)
        self._fh = open(path, "ab")  # noqa: SIM115 - kept open for the whole build
        if good == 0:
            self._append({"header": header})

    def _append(self, record: dict[str, Any]) -> bytes:
        line = json.dumps(record, sort_keys=True).encode()
        self._fh.write(line + b"\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return line

    def add(self, record: dict[str, Any]) -> None:
        """Append one finished task's record durably."""
        # Keep what was written, not the object: a first build and a resumed one then
        # read the very same record, so their rows.jsonl are byte-identical.
        self.done[record["key"]] = json.loads(self._append(record))

    def close(self) -> None:
        """Close the file (the journal stays on disk: a rerun reuses it)."""
        self._fh.close()


def build_bank(
    bench: Benchmark,
    root: str | Path,
    *,
    tasks_per_track: int = 1,
    backend: str = "local",
    protocol: str = "hermes",
    tracks: Sequence[str] | None = None,
    outcomes: Sequence[str] = ("success",),
    surrogates: int = 0,
    surrogate_cases: int = 1,
    surrogate_validation_passes: int | None = 1,
    teacher: Policy | None = None,
    workers: int = 1,
) -> StageBank:
    """Build a bank of every focus x track x outcome from training seeds.

    For each task and outcome the teacher's turns are stepped through a real E2E env;
    before the first turn of each stage the workspace is captured as that stage's start
    state. ``tracks`` limits the bank to those tracks (default: all of the spec's).

    The teacher is the benchmark's scripted one (``teacher=None``) or any
    :class:`~bat_gym.policies.Policy`. The scripted teacher labels its turns by stage
    and is asked for each outcome in turn. Outcomes the benchmark does not declare in
    :attr:`Benchmark.outcomes` are not built (the teacher is never asked for them);
    the manifest lists them under ``unsupported_outcomes``. A policy plays each task
    once; its stage boundaries are read from the workspace (the next stage begins
    after the turn in which every earlier stage's artifacts first all exist, see
    :func:`~bat_gym.bank.policy_teacher.policy_trajectory`), and its recorded
    actions are then replayed like the scripted teacher's, stored with the rows so
    :meth:`~bat_gym.bank.StageBank.verify` can replay them again. The verifier labels
    a policy's trajectory: ``success`` at an E2E reward of at least
    :func:`~bat_gym.bank.tasks.success_threshold` (:data:`~bat_gym.bank.SUCCESS_MIN_REWARD`
    of what a correct run earns on the task), else ``failure``; a label not in
    ``outcomes`` rejects it (``recovery`` cannot be told from a free policy's
    trajectory and is unsupported).

    Only trajectories the verifier agrees with are kept: a success trajectory must
    reach an E2E rubric reward of at least
    :func:`~bat_gym.bank.tasks.success_threshold`: :data:`~bat_gym.bank.SUCCESS_MIN_REWARD`
    times the E2E reward of a correct run on that task (the reference run's task score,
    full stage credit), so a task whose provided model is imperfect can still be passed;
    recovery and failure trajectories of the scripted teacher are kept as labelled
    (scored all the same: the verdict is their E2E row's demonstration).
    Then every row passes the admission gates (:class:`~bat_gym.bank.Admission`), and
    is admitted only if honest work wins it: a demonstrator of the behaviour it
    teaches, played from the row's own start state and scored by the row's own
    contract, earns at least :data:`~bat_gym.bank.demonstrate.ADMIT_MIN_SHARE` of the
    row's attainable reward (:mod:`bat_gym.bank.demonstrate`; the demonstration is
    stored with the row). Rejections are counted by reason in the manifest's
    ``rejected``: whole trajectories by their reason, rows by ``gate <name>`` or by the
    demonstration's reason; ``trajectories`` counts the trajectories the verifier
    kept, ``admission`` the rows checked and admitted, and ``admission.shares`` the
    admitted share of the candidate rows per focus and outcome.

    The manifest also records provenance: the generator (benchmark, spec version,
    class), the seeds per track, the teacher (``scripted`` or the policy's
    ``identity()``), the reduction grid of the surrogates, and the sha256 of every
    contract in the benchmark's library.

    The build is resumable: each finished task is appended (fsynced) to
    ``rows.partial.jsonl``, and a rerun into the same directory skips tasks already
    there. ``rows.jsonl`` and then ``manifest.json`` are written last, each atomically.

    Args:
        bench: the benchmark.
        root: the bank directory.
        tasks_per_track: training tasks per track.
        backend: the sandbox backend.
        protocol: the tool protocol of the stored conversations.
        tracks: the tracks to build (default: all).
        outcomes: the outcomes to build.
        surrogates: per track, how many extra E2E surrogate rows to build: the
            first training seeds' tasks reduced with :meth:`Benchmark.reduce_task`
            to ``surrogate_cases`` cases, played by the success teacher (or the
            policy) and kept only at an E2E reward of at least
            :data:`~bat_gym.bank.SUCCESS_MIN_REWARD`. Their state ids end in
            ``.surrogate`` and their provenance records the reduction; the manifest's
            ``surrogates`` counts planned, kept and rejected ones.
        surrogate_cases: the cases a surrogate task keeps.
        surrogate_validation_passes: the pilot runs a surrogate's trajectory may make
            in the Validate stage (None: no limit); recorded in the reduction.
        teacher: the policy that plays the tasks (default: the scripted teacher).
        workers: processes building tasks at once (forked from this one; the journal
            keeps one writer, this process). A policy must survive a fork.

    Raises:
        BankError: ``root`` holds an unfinished build with different settings, or a
            sandbox crashed under a policy.
        PolicyError: the policy's backend failed (finished tasks stay journalled).
        ConfigError: an unknown outcome, a negative ``surrogates``, a
            ``surrogate_cases`` or ``workers`` below 1, or a negative
            ``surrogate_validation_passes``.
    """
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    plan = Plan.make(
        bench,
        tasks_per_track=tasks_per_track,
        protocol=protocol,
        tracks=tracks,
        outcomes=outcomes,
        surrogates=surrogates,
        surrogate_cases=surrogate_cases,
        surrogate_validation_passes=surrogate_validation_passes,
        teacher=teacher,
    )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(root / "store")
    journal = _Journal(root / "rows.partial.jsonl", plan.header)
    builder = Builder(
        bench, store, backend, protocol, teacher, tuple(plan.supported), tuple(plan.tracks)
    )
    try:
        todo = [j for j in plan.all_jobs if j.key not in journal.done]
        with progress.task(
            f"building {bench.name} bank: teacher trajectories",
            len(plan.all_jobs),
            done=len(plan.all_jobs) - len(todo),
        ) as shown:
            run_jobs(builder, todo, journal.add, workers, shown)
    finally:
        builder.close()
        journal.close()
    return write_bank(bench, root, plan, journal.done, str(journal.path))


@dataclass
class Plan:
    """What a build is asked for: its jobs, and the settings its manifest records."""

    header: dict[str, Any]
    jobs: list[Job]
    surrogate_jobs: list[Job]
    tracks: list[str]
    seeds: list[int]
    surrogate_seeds: list[int]
    wanted: list[str]
    supported: list[str]
    reduction: dict[str, Any]
    tasks_per_track: int
    surrogates: int
    teacher: bool

    @property
    def all_jobs(self) -> list[Job]:
        """Every job, trajectories first, then surrogates."""
        return [*self.jobs, *self.surrogate_jobs]

    @classmethod
    def make(
        cls,
        bench: Benchmark,
        *,
        tasks_per_track: int = 1,
        protocol: str = "hermes",
        tracks: Sequence[str] | None = None,
        outcomes: Sequence[str] = ("success",),
        surrogates: int = 0,
        surrogate_cases: int = 1,
        surrogate_validation_passes: int | None = 1,
        teacher: Policy | None = None,
    ) -> Plan:
        """The plan of :func:`build_bank` for these arguments (see there; same errors)."""
        if surrogates < 0 or surrogate_cases < 1:
            raise ConfigError(
                f"surrogates must be >= 0 and surrogate_cases >= 1, got {surrogates}, {surrogate_cases}"
            )
        if surrogate_validation_passes is not None and surrogate_validation_passes < 0:
            raise ConfigError(
                f"surrogate_validation_passes must be >= 0 or None, got {surrogate_validation_passes}"
            )
        seeds = list(bench.seeds("train"))[:tasks_per_track]
        track_names = list(tracks or [t.name for t in bench.spec.tracks])
        for track in track_names:
            bench.spec.track(track)  # an unknown name fails here, naming the known ones
        wanted = list(dict.fromkeys(outcomes))
        unknown = [o for o in wanted if o not in OUTCOMES]
        if unknown:
            raise ConfigError(f"unknown outcome(s) {unknown}; choose from {list(OUTCOMES)}")
        declared = bench.outcomes if teacher is None else POLICY_OUTCOMES
        supported = [o for o in wanted if o in declared]
        header = {
            "benchmark": bench.name,
            "version": bench.spec.version,
            "format": BANK_FORMAT,
            "protocol": protocol,
            "teacher": teacher_identity(teacher),
        }
        if teacher is None:
            jobs = [
                Job(_task_key(t, s, o), t, s, o)
                for t in track_names
                for s in seeds
                for o in supported
            ]
        else:
            # One episode per task; the verifier says which of the outcomes it is.
            jobs = [Job(_task_key(t, s, "policy"), t, s, None) for t in track_names for s in seeds]
            jobs = jobs if supported else []
        reduction: dict[str, Any] = {"max_cases": surrogate_cases}
        if surrogate_validation_passes is not None:
            reduction["validation_passes"] = surrogate_validation_passes
        surrogate_seeds = list(bench.seeds("train"))[:surrogates]
        surrogate_jobs = [
            Job(
                _surrogate_key(t, s, reduction),
                t,
                s,
                "success" if teacher is None else None,
                reduction,
            )
            for t in track_names
            for s in surrogate_seeds
        ]
        return cls(
            header=header,
            jobs=jobs,
            surrogate_jobs=surrogate_jobs,
            tracks=track_names,
            seeds=seeds,
            surrogate_seeds=surrogate_seeds,
            wanted=wanted,
            supported=supported,
            reduction=reduction,
            tasks_per_track=tasks_per_track,
            surrogates=surrogates,
            teacher=teacher is not None,
        )


def write_bank(
    bench: Benchmark,
    root: Path,
    plan: Plan,
    records: Mapping[str, dict[str, Any]],
    origin: str,
) -> StageBank:
    """Gather every job's record in plan order into ``rows.jsonl`` and the manifest.

    ``records`` holds one finished record per job key; ``origin`` names where they were
    read from, for error messages.
    """
    states: list[StageState] = []
    main, sur = _Tally(), _Tally()
    for job in plan.jobs:
        states += main.add(records[job.key], job, origin)
    extra: dict[str, Any] = {}
    if plan.surrogate_jobs:
        surrogate_rows = [
            row for job in plan.surrogate_jobs for row in sur.add(records[job.key], job, origin)
        ]
        states += surrogate_rows
        extra["surrogates"] = {
            "per_track": plan.surrogates,
            "reduction": plan.reduction,
            "planned": len(plan.surrogate_jobs),
            # One row per surrogate: kept means admitted, past the verifier and the gates.
            "kept": len(surrogate_rows),
            "rejected": dict(sorted(sur.rejected.items())),
        }
    if plan.teacher:
        extra["labels"] = dict(sorted(main.labels.items()))
        extra["stages_without_turns"] = dict(sorted(main.skipped.items()))
    library = bench.contract_library()
    StageBank.write(
        root,
        states,
        {
            **plan.header,
            "tasks_per_track": plan.tasks_per_track,
            "tracks": plan.tracks,
            "outcomes": plan.supported,
            "unsupported_outcomes": [o for o in plan.wanted if o not in plan.supported],
            "trajectories": {"planned": len(plan.jobs), "kept": main.kept},
            "rejected": dict(sorted(main.rejected.items())),
            "success_min_reward": SUCCESS_MIN_REWARD,
            "success_threshold": "success_min_reward x the E2E reward of a correct run",
            "generator": {
                "benchmark": bench.name,
                "version": bench.spec.version,
                "class": f"{type(bench).__module__}.{type(bench).__qualname__}",
            },
            "seeds": {
                "tasks": {t: plan.seeds if plan.jobs else [] for t in plan.tracks},
                "surrogates": {t: plan.surrogate_seeds for t in plan.tracks},
            },
            "reduction_grid": [plan.reduction] if plan.surrogate_jobs else [],
            "contracts": {c.id: c.sha256 for c in sorted(library, key=lambda c: c.id)},
            "admission": {
                "gates": list(GATES),
                "rows_checked": main.checked + sur.checked,
                "rows_admitted": len(states),
                "demonstration_min_share": ADMIT_MIN_SHARE,
                "shares": main.share_table(),
            },
            "bat_gym_version": _version(),
            **extra,
        },
    )
    return StageBank(root)


def _version() -> str:
    from bat_gym import __version__

    return __version__


@dataclass
class _Tally:
    """Rows and counts of a plan's journal records, gathered in plan order."""

    kept: int = 0
    checked: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    records: list[dict[str, Any]] = field(default_factory=list)

    def add(self, record: dict[str, Any], job: Job, origin: str) -> list[StageState]:
        """Count ``job``'s record and return its admitted rows."""
        if record.get("rejected"):
            self.rejected[record["rejected"]] += 1
            return []
        self.kept += 1
        self.labels[record.get("outcome", job.outcome or "")] += 1
        self.skipped.update(record.get("stages_without_turns", []))
        self.rejected.update({f"gate {g}": n for g, n in record.get("gate_rejected", {}).items()})
        for row in record.get("candidates", []):
            # Gate refusals are counted above by gate; a demonstration's by its reason.
            refused = row["refused"]
            if refused is not None and not refused.startswith("gate "):
                self.rejected[refused] += 1
        self.records.append(record)
        self.checked += record.get("rows_checked", len(record["rows"]))
        where = f"{origin}:{record['key']}"
        return [load_model(StageState, r, origin=where) for r in record["rows"]]

    def share_table(self) -> dict[str, dict[str, dict[str, int]]]:
        """The admitted share table (``admission.shares``) over the kept records' rows."""
        return admission_shares(self.records)
