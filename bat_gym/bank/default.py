"""The benchmark's default states: built one teacher trajectory at a time, on first use.

Without ``states=``, an env reads :class:`DefaultStates`: the grid a plain
``build_bank(bench, outcomes=bench.outcomes)`` would build (one training task per
track, every outcome the teacher declares, every focus), but built lazily. Every
planned state id is known before any episode runs: a row's id is
``<task id>.<focus>.<outcome>``, the task id comes from the task generator, and the
focuses a trajectory yields are E2E and the stages its scripted turns are labelled
with. ``get()`` builds only the one teacher trajectory that holds the state asked
for, which yields that trajectory's state for every focus, and demonstrates only the
row asked for (the others wait, ``pending`` in the record, until they are asked for).
Whether a row is admitted (a demonstration played from the row wins it,
:mod:`bat_gym.bank.demonstrate`) is known only once it is demonstrated, so
``select()`` lists the planned ids and
``get()`` of a row no honest play wins raises
:class:`~bat_gym.core.errors.StateNotAdmitted`; a seeded ``reset()`` walks a seeded order
of the ids to the first admitted one, so it picks the same state on a fresh cache, a
warm one and the completed bank, and never a row that is not admitted.

Everything lives in bat_gym's cache under a key of the benchmark's name, version and
contracts, bat_gym's version, the bank format and the digest of the benchmark's code,
so an edited benchmark never reuses stale states::

    <cache>/banks/<benchmark>-<key>/
        plan.json                      the planned trajectories and their state ids
        trajectories/<key>.json        one accepted trajectory's record (its admitted
                                       rows, and the rows not demonstrated yet)
        trajectories/<key>.rejected.json   the last rejected attempt, for ``bank explain``
        store/                         the snapshots of every state
        rows.jsonl, manifest.json      the whole grid as a StageBank, once complete

Each trajectory is built under a file lock, so vector-env workers that want the same
one wait for the first, and others build in parallel. Its rows pass the admission
gates and the demonstration as in :func:`~bat_gym.bank.build_bank`, the leakage gate
indexing the held-out tasks of the trajectory's own track (as a build of that one
track does);
``bat-gym bank audit`` measures a bank against every track. A trajectory that the verifier
or the admission gates reject is never cached as a good one: asking for its states
raises :class:`~bat_gym.core.errors.TrajectoryRejected` with the teacher's verdict, so a
broken teacher is reported where it is, not as a missing focus later.

:func:`default_bank` returns the complete grid as a :class:`StageBank` (building
what is missing), for what reads every state at once (trainers, exploit audits).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bat_gym.bank.build import Plan, write_bank
from bat_gym.bank.store import BANK_FORMAT, StageBank
from bat_gym.bank.tasks import Builder, Job, demonstrate_pending
from bat_gym.benchmark import Benchmark
from bat_gym.core import progress
from bat_gym.core.errors import BankError, StateNotAdmitted, StateNotFound, TrajectoryRejected
from bat_gym.core.files import cache_dir, write_atomic
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import E2E, StageState, load_model

__all__ = [
    "DefaultStates",
    "cache_dir",
    "default_bank",
    "default_root",
    "default_states",
    "package_digest",
    "state_source",
]

# 2: built per trajectory on demand (1 was one bank built whole on first use)
_LAYOUT = 2
_BACKEND = "local"
_PROTOCOL = "hermes"


@functools.cache
def package_digest(module: str) -> str:
    """sha256 over the files of the package that defines ``module`` (its code and data).

    Bytecode caches are left out. A module outside any package digests its own file.
    """
    mod = sys.modules.get(module)
    path = Path(getattr(mod, "__file__", "") or "")
    if not path.is_file():
        return ""
    root = path.parent if getattr(mod, "__package__", None) else path
    files = sorted(root.rglob("*")) if root.is_dir() else [root]
    h = hashlib.sha256()
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(f"{f.relative_to(root.parent)}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def default_root(bench: Benchmark) -> Path:
    """The cache directory of ``bench``'s default states (content-keyed, see the module)."""
    from bat_gym import __version__

    # Rows pin contract digests, so an edited contract must not reuse an old bank; and
    # the states hold files the benchmark's code wrote, so edited code must not either.
    contracts = [ref.sha256 for f in bench.spec.focuses if (ref := bench.contract_ref(f))]
    code = package_digest(type(bench).__module__)
    key = hashlib.sha256(
        f"{bench.name}/{bench.spec.version}/{__version__}/{BANK_FORMAT}/{contracts}/"
        f"{bench.outcomes}/{code}/{_LAYOUT}".encode()
    ).hexdigest()[:12]
    return cache_dir() / "banks" / f"{bench.name}-{key}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created) for the block, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or torn."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class _Trajectory:
    """One planned teacher trajectory of the grid and the state ids it yields."""

    job: Job
    task_id: str
    focuses: tuple[str, ...]  # E2E, then each stage in the order the teacher reaches it

    @property
    def ids(self) -> tuple[str, ...]:
        """The state ids this trajectory yields, one per focus."""
        return tuple(f"{self.task_id}.{f}.{self.job.outcome}" for f in self.focuses)

    @property
    def file(self) -> str:
        """A file-name-safe form of the job key."""
        return self.job.key.replace("/", "-")


class DefaultStates:
    """A benchmark's default states, built one teacher trajectory at a time.

    A :class:`~bat_gym.bank.StateSource`: ``select()`` lists the whole grid's ids
    without building anything; ``get()`` builds (or loads) the trajectory holding the
    state. See the module docstring for the layout and the guarantees.

    Args:
        bench: the benchmark.
        root: the cache directory (default: :func:`default_root`).
    """

    def __init__(self, bench: Benchmark, root: str | Path | None = None) -> None:
        self.bench = bench
        self.root = Path(root) if root is not None else default_root(bench)
        self.store = BlobStore(self.root / "store")
        self._plan: Plan | None = None
        self._trajectories: list[_Trajectory] | None = None
        self._by_id: dict[str, _Trajectory] = {}
        self._rows: dict[str, StageState] = {}
        self._bank: StageBank | None = None
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        # Sent to another process (a Ray actor, a spawned worker): the benchmark and the
        # cache directory; rows and locks are that process's own.
        return {"bench": self.bench, "root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["bench"], state["root"])  # type: ignore[misc]

    # -- the plan ---------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The build plan: the same jobs as ``build_bank(bench, outcomes=bench.outcomes)``."""
        if self._plan is None:
            self._plan = Plan.make(self.bench, outcomes=self.bench.outcomes, protocol=_PROTOCOL)
        return self._plan

    @property
    def trajectories(self) -> list[_Trajectory]:
        """Every planned trajectory with its state ids (computed once, then cached)."""
        with self._lock:
            if self._trajectories is None:
                self._trajectories = self._load_trajectories()
                self._by_id = {i: t for t in self._trajectories for i in t.ids}
            return self._trajectories

    def _load_trajectories(self) -> list[_Trajectory]:
        path = self.root / "plan.json"
        jobs = self.plan.jobs
        planned = self._parse_plan(_read_json(path), jobs)
        if planned is not None:
            return planned
        with _locked(self.root / "plan.lock"):
            planned = self._parse_plan(_read_json(path), jobs)
            if planned is None:
                planned = self._make_plan(jobs)
                data = [
                    {"key": t.job.key, "task_id": t.task_id, "focuses": list(t.focuses)}
                    for t in planned
                ]
                write_atomic(path, json.dumps({"trajectories": data}, indent=1))
        return planned

    @staticmethod
    def _parse_plan(data: Any, jobs: list[Job]) -> list[_Trajectory] | None:
        try:
            rows = {r["key"]: r for r in data["trajectories"]}
            return [
                _Trajectory(j, str(rows[j.key]["task_id"]), tuple(rows[j.key]["focuses"]))
                for j in jobs
            ]
        except (TypeError, KeyError):
            return None

    def _make_plan(self, jobs: list[Job]) -> list[_Trajectory]:
        """Regenerate each planned task and read its stages off the teacher's script."""
        bench = self.bench
        out = []
        with progress.task(
            f"first use: planning {bench.name}'s default states", len(jobs)
        ) as shown:
            for job in jobs:
                outcome = job.outcome or "success"
                # A benchmark that names its teacher's stages is planned without
                # generating a task: the id is named by the benchmark, not the data.
                stages = bench.teacher_stages(job.track, outcome)
                task_id = bench.task_id(job.track, job.seed, "train")
                if stages is None:
                    task = bench.task_of(job.track, job.seed, "train")
                    assert task is not None  # no reduction: the task always exists
                    stages = tuple(t.stage for t in bench.teacher_script(task, outcome))
                    task_id = task.task_id
                focuses = (E2E, *dict.fromkeys(s for s in stages if s != E2E))
                out.append(_Trajectory(job, task_id, focuses))
                shown.advance()
        return out

    # -- StateSource ------------------------------------------------------------------

    def _complete_bank(self) -> StageBank | None:
        """The whole grid, if it was completed (by :meth:`complete`) here before."""
        if self._bank is None and (self.root / "manifest.json").is_file():
            with contextlib.suppress(BankError):
                self._bank = StageBank(self.root)
        return self._bank

    def select(
        self, focus: str | None = None, track: str | None = None, outcome: str | None = None
    ) -> list[str]:
        """Ids of the grid's states with this focus, track and outcome (None: any), sorted.

        Nothing is built: until the grid is completed the ids are the plan's, and a
        planned row may turn out not to be admitted (its demonstration does not win it),
        which :meth:`get` then says with :class:`~bat_gym.core.errors.StateNotAdmitted`. A
        seeded ``reset()`` ranks the ids by a seeded hash and takes the first admitted
        one (:meth:`bat_gym.env.StageEnv.reset`), so it builds only what it walks past
        and picks the same state from this plan, a warm cache or the completed bank.
        """
        bank = self._complete_bank()
        if bank is not None:
            return bank.select(focus, track, outcome)
        return sorted(
            i
            for t in self.trajectories
            for i, f in zip(t.ids, t.focuses, strict=True)
            if (focus is None or f == focus)
            and (track is None or t.job.track == track)
            and (outcome is None or (t.job.outcome or "success") == outcome)
        )

    def get(self, state_id: str) -> StageState:
        """The state with this id; its trajectory is built now if it was never built.

        Raises:
            StateNotFound: the id is not one of the grid's.
            StateNotAdmitted: the id is planned, but no demonstration wins the row.
            TrajectoryRejected: the teacher's trajectory holding it was rejected (the
                message carries the verdict).
        """
        bank = self._complete_bank()
        if bank is not None:
            return bank.get(state_id)
        with self._lock:
            if state_id in self._rows:
                return self._rows[state_id]
            self.trajectories  # noqa: B018 - fills _by_id
            trajectory = self._by_id.get(state_id)
            if trajectory is None:
                raise StateNotFound(state_id, sorted(self._by_id)[:50])
            for row in self._trajectory_rows(trajectory, wanted=state_id):
                self._rows[row.state_id] = row
            if state_id not in self._rows:
                record = _read_json(self.root / "trajectories" / f"{trajectory.file}.json")
                why = _not_demonstrated(record or {}).get(state_id, "not admitted")
                raise StateNotAdmitted(state_id, why)
            return self._rows[state_id]

    # -- building ---------------------------------------------------------------------

    def _trajectory_rows(self, t: _Trajectory, wanted: str | None = None) -> list[StageState]:
        """The admitted rows of ``t``: loaded from the cache, or built (under its lock) and cached.

        ``wanted``: the one row asked for. Building for it demonstrates that row (and a
        success trajectory's E2E row, whose demonstration is the trajectory itself) and
        leaves the others pending until they are asked for; a first reset then plays one
        demonstration, not one per focus. None: every row is demonstrated (the whole grid's build).
        """
        folder = self.root / "trajectories"
        path = folder / f"{t.file}.json"
        record = _read_json(path)
        if record is None or _pending_ids(record, wanted):
            with _locked(folder / f"{t.file}.lock"):
                record = _read_json(path)  # another process may have built it meanwhile
                if record is None:
                    record = self._build(t, wanted)
                    problem = _problem(record, t)
                    if problem is not None:
                        write_atomic(folder / f"{t.file}.rejected.json", json.dumps(record))
                        raise TrajectoryRejected(t.job.key, problem)
                    write_atomic(path, json.dumps(record))
                elif pending := _pending_ids(record, wanted):
                    record = self._demonstrate(t, record, pending)
                    write_atomic(path, json.dumps(record))
        problem = _problem(record, t)
        if problem is not None:  # a cached record no longer fits the plan
            raise TrajectoryRejected(t.job.key, problem)
        where = f"{path}:{t.job.key}"
        rows = [load_model(StageState, r, origin=where) for r in record["rows"]]
        return [r for r in rows if r.state_id in t.ids]

    def _builder(self, t: _Trajectory) -> Builder:
        return Builder(
            self.bench,
            self.store,
            _BACKEND,
            _PROTOCOL,
            None,
            tuple(self.plan.supported),
            (t.job.track,),
        )

    def _demonstrate(self, t: _Trajectory, record: dict[str, Any], ids: set[str]) -> dict[str, Any]:
        """``record`` with the pending rows ``ids`` demonstrated (admitted or refused)."""
        builder = self._builder(t)
        try:
            with progress.task(f"first use: demonstrating {', '.join(sorted(ids))}"):
                return demonstrate_pending(builder, t.job, record, ids)
        finally:
            builder.close()

    def _build(self, t: _Trajectory, wanted: str | None = None) -> dict[str, Any]:
        index = self.trajectories.index(t) + 1
        builder = self._builder(t)
        what = (
            f"first use: building {self.bench.name} trajectory {t.job.key} "
            f"({index}/{len(self.trajectories)}, then cached)"
        )
        builder.admission.prefetch()
        defer = None if wanted is None else (lambda state: state.state_id != wanted)
        # A trajectory's score demonstrates its E2E row only: built for another row, a
        # scripted recovery or failure trajectory goes unscored (its E2E row waits).
        e2e_wanted = any(i == wanted and f == E2E for i, f in zip(t.ids, t.focuses, strict=True))
        try:
            with progress.task(what):
                return builder.build(t.job, defer=defer, score=wanted is None or e2e_wanted)
        finally:
            builder.close()

    def records(self) -> dict[str, dict[str, Any]]:
        """The cached record of every trajectory built so far, accepted or rejected, by key.

        An accepted record wins over a rejected attempt of the same trajectory.
        """
        out: dict[str, dict[str, Any]] = {}
        folder = self.root / "trajectories"
        for t in self.trajectories:
            for name in (f"{t.file}.json", f"{t.file}.rejected.json"):
                record = _read_json(folder / name)
                if record is not None:
                    out[t.job.key] = record
                    break
        return out

    def complete(self, workers: int = 1) -> StageBank:
        """The whole grid as a :class:`StageBank`, building every trajectory not built yet.

        The bank is written into :attr:`root` (sharing its store) only when every
        trajectory was accepted, so a partial or empty grid is never cached as whole.

        Args:
            workers: trajectories built at once, one forked process each.

        Raises:
            TrajectoryRejected: a trajectory was rejected (the first one met).
        """
        bank = self._complete_bank()
        if bank is not None:
            return bank
        trajectories = self.trajectories
        folder = self.root / "trajectories"
        # Not built, or built for one row with others still pending.
        todo = [
            t
            for t in trajectories
            if (r := _read_json(folder / f"{t.file}.json")) is None or r.get("pending")
        ]
        with progress.task(
            f"{self.bench.name} default states: whole grid",
            len(trajectories),
            done=len(trajectories) - len(todo),
        ) as shown:
            if workers > 1 and len(todo) > 1:
                self._build_in_workers(todo, workers, shown)
            else:
                for t in todo:
                    self._trajectory_rows(t)
                    shown.advance()
        records = {t.job.key: _read_json(folder / f"{t.file}.json") for t in trajectories}
        with _locked(self.root / "bank.lock"):
            if not (self.root / "manifest.json").is_file():
                write_bank(self.bench, self.root, self.plan, records, str(folder))
        self._bank = StageBank(self.root)
        return self._bank

    def _build_in_workers(self, todo: list[_Trajectory], workers: int, shown: Any) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # Fork: workers inherit this source and its benchmark as they are (neither need
        # be picklable); each builds under the trajectory's lock, as any process would.
        _FORKED["source"] = self
        context = multiprocessing.get_context("fork")
        try:
            with (
                progress.use(progress.SilentReporter()),
                ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool,
            ):
                for _ in pool.map(_build_one, [self.trajectories.index(t) for t in todo]):
                    shown.advance()
        finally:
            _FORKED.clear()


_FORKED: dict[str, DefaultStates] = {}


def _build_one(index: int) -> None:
    source = _FORKED["source"]
    source._trajectory_rows(source.trajectories[index])


def _pending_ids(record: dict[str, Any], wanted: str | None) -> set[str]:
    """The rows of ``record`` still to demonstrate for ``wanted`` (None: all of them)."""
    pending = {r["state_id"] for r in record.get("pending", [])}
    return pending if wanted is None else pending & {wanted}


def _not_demonstrated(record: dict[str, Any]) -> dict[str, str]:
    """The rows of ``record`` whose demonstration did not win them: state id -> why."""
    return {
        c["state_id"]: c["refused"]
        for c in record.get("candidates", [])
        if c["refused"] is not None and not c["refused"].startswith("gate ")
    }


def _problem(record: dict[str, Any], t: _Trajectory) -> str | None:
    """Why ``record`` does not give the states ``t`` promises (None: it does).

    A row that no demonstration wins is not admitted, by design, and is no problem
    here. The reason carries the verifier's verdict in brief (reward, evidence
    completeness, the items that fell short) and, for rows the gates refused, the gate
    and its finding.
    """
    if record.get("rejected"):
        return f"{record['rejected']}{_verdict_text(record.get('verdict'))}"
    have = (
        {r.get("state_id") for r in record.get("rows", [])}
        | set(_not_demonstrated(record))
        | _pending_ids(record, None)
    )
    missing = [i for i in t.ids if i not in have]
    if not missing:
        return None
    findings = "; ".join(
        f"{sid}: gate {gate}: {what}" for sid, gate, what in record.get("gate_findings", [])
    )
    return (
        f"the admission gates refused {len(missing)} of its {len(t.ids)} states"
        f"{f' ({findings})' if findings else ''}{_verdict_text(record.get('verdict'))}"
    )


def _verdict_text(verdict: dict[str, Any] | None, *, items: int = 4) -> str:
    """The verdict in brief, on one line: reward, eta, and the first items that fell short."""
    if not verdict:
        return ""
    reward = verdict.get("reward")
    parts = [f"reward {'null' if reward is None else f'{reward:.3f}'}", f"eta {verdict['eta']:.2f}"]
    order = {"failed": 0, "no evidence": 1, "null": 2}  # what the teacher got wrong first
    ranked = sorted(verdict.get("items", []), key=lambda i: order.get(i["status"], 3))
    shown = ranked[:items]
    for item in shown:
        evidence = f" [{', '.join(item['evidence'])}]" if item.get("evidence") else ""
        parts.append(f"{item['stage']}.{item['item']} {item['status']}: {item['detail']}{evidence}")
    more = len(verdict.get("items", [])) - len(shown)
    if more > 0:
        parts.append(f"{more} more item(s) short")
    parts += verdict.get("gates", [])
    return "; verdict: " + "; ".join(parts)


_SOURCES: dict[tuple[int, Path], DefaultStates] = {}
_SOURCES_LOCK = threading.Lock()


def default_states(bench: Benchmark) -> DefaultStates:
    """``bench``'s default states (one shared instance per benchmark and cache directory)."""
    root = default_root(bench)
    with _SOURCES_LOCK:
        key = (id(bench), root)
        source = _SOURCES.get(key)
        if source is None or source.bench is not bench:
            source = _SOURCES[key] = DefaultStates(bench, root)
        return source


def default_bank(bench: Benchmark, *, workers: int = 1) -> StageBank:
    """``bench``'s whole default grid as a :class:`StageBank`, built where missing.

    The small grid: one training task per track, every focus, and every teacher outcome
    the benchmark declares (for MedBench-Lite the reference 126-state grid), so the
    curriculum can balance a round over tracks and outcomes. It shares its cache with
    the lazily built :func:`default_states`.

    Raises:
        TrajectoryRejected: a teacher trajectory was rejected (with its verdict).
    """
    return default_states(bench).complete(workers=workers)


def state_source(states: Any, bench: Benchmark) -> Any:
    """What an env reads its states from, given its ``states=`` argument.

    None: the benchmark's :func:`default_states`; a path: the :class:`StageBank` there;
    anything else is taken to be a StateSource already.
    """
    if states is None:
        return default_states(bench)
    if isinstance(states, (str, Path)):
        return StageBank(states)
    return states
