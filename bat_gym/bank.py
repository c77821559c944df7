"""The Stage Bank: replayable stage states on disk, and how they are built.

A bank is a directory::

    rows.jsonl          one StageState per line
    manifest.json       benchmark, version, outcomes, rejections, sha256 of rows.jsonl
    store/              the blob store holding every workspace snapshot
    rows.partial.jsonl  the build's journal: one fsynced line per finished task

Building runs the benchmark's teacher through a real env episode (E2E focus) for each
training task, and at every stage boundary stores the workspace snapshot and the
conversation so far: the start state of that stage's envs. Only training seeds are
used; held-out seeds never enter a bank (:mod:`bat_gym.audit` checks this).
:meth:`StageBank.verify` re-checks a bank's bytes and replays its boundaries.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, get_args

from bat_gym.benchmark import Benchmark, Split
from bat_gym.errors import BankError, StateNotFound
from bat_gym.sandbox.snapshot import BlobStore, Snapshot, WorkspaceIndex
from bat_gym.spec import E2E, Outcome, StageState, load_model

__all__ = [
    "BankReport",
    "OUTCOMES",
    "SUCCESS_MIN_REWARD",
    "StateSource",
    "StageBank",
    "cache_dir",
    "default_bank",
    "build_bank",
    "fit_history",
    "task_states",
]

BANK_FORMAT = 5  # 3: contract refs; 4: history fitted to the prompt budget; 5: outcomes
OUTCOMES: tuple[str, ...] = get_args(Outcome)
SUCCESS_MIN_REWARD = 0.95  # a success trajectory below this E2E reward is not a success
SURROGATE = "surrogate"  # the state id suffix of an E2E surrogate row


class StateSource(Protocol):
    """Where envs get their start states: a bank, or anything shaped like one."""

    store: BlobStore

    def get(self, state_id: str) -> StageState:
        """The state with this id; raises StateNotFound."""

    def select(self, focus: str | None = None, track: str | None = None) -> list[str]:
        """Ids of the states matching the filters, in a stable order."""


class _StateLookup:
    """``get`` and ``select`` over ``self._rows`` (state id -> StageState)."""

    _rows: dict[str, StageState]

    def get(self, state_id: str) -> StageState:
        """The state with this id."""
        try:
            return self._rows[state_id]
        except KeyError:
            raise StateNotFound(state_id, list(self._rows)[:50]) from None

    def select(self, focus: str | None = None, track: str | None = None) -> list[str]:
        """Ids of states with this focus and track (None matches any), sorted."""
        return sorted(
            s.state_id
            for s in self._rows.values()
            if (focus is None or s.focus == focus) and (track is None or s.track == track)
        )


class StageBank(_StateLookup):
    """A directory of stage states and their snapshots.

    Args:
        root: the bank directory.

    Raises:
        BankError: the directory is not a complete bank, or ``rows.jsonl`` does not
            match the manifest's digest.
        SpecError: a row fails validation (the message names line and field).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        rows_path = self.root / "rows.jsonl"
        try:
            manifest = json.loads((self.root / "manifest.json").read_text())
            data = rows_path.read_bytes()
        except FileNotFoundError as exc:
            missing = Path(exc.filename).name
            raise BankError(
                str(self.root),
                f"not a Stage Bank ({missing} is missing); build one with `bat-gym bank build --out DIR`",
            ) from None
        except json.JSONDecodeError as exc:
            raise BankError(
                str(self.root / "manifest.json"), f"not valid JSON: {exc.msg}"
            ) from None
        if hashlib.sha256(data).hexdigest() != manifest.get("rows_sha256"):
            raise BankError(
                str(rows_path),
                "rows.jsonl does not match the digest in manifest.json (edited or corrupted)",
            )
        self.store = BlobStore(self.root / "store")
        self.manifest: dict[str, Any] = manifest
        self._rows: dict[str, StageState] = {}
        for n, line in enumerate(data.decode().splitlines(), 1):
            row = load_model(StageState, json.loads(line), origin=f"{rows_path}:{n}")
            self._rows[row.state_id] = row

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[StageState]:
        return iter(self._rows.values())

    def verify(
        self,
        *,
        sample: int | None = None,
        seed: int = 0,
        backend: str = "local",
        bench: Benchmark | None = None,
    ) -> BankReport:
        """Re-check the bank's blobs, snapshot manifests and stage boundaries.

        Every blob's sha256 is recomputed against its name; every snapshot manifest is
        parsed, its digest recomputed against its name, and its files looked up; every
        row's snapshot must exist. Then, for ``sample`` rows (default: all; a seeded,
        deterministic choice), the teacher prefix is replayed in a fresh sandbox on a
        private store and the workspace digest at the row's boundary must equal the
        row's snapshot. The bank itself is only read.

        Args:
            sample: how many rows to replay (None: all).
            seed: the seed of the sample's choice.
            backend: the sandbox backend to replay in.
            bench: the benchmark (default: the registered one the manifest names).
        """
        report = BankReport("verify")
        bad = _verify_store(self.store, report)
        for row in self:
            if not (self.store.root / "snapshots" / f"{row.snapshot}.json").is_file():
                report.find("rows", row.state_id, f"snapshot {row.snapshot} is not in the store")
                continue
            with contextlib.suppress(Exception):  # a broken manifest is reported above
                for e in self.store.get_snapshot(row.snapshot).entries:
                    if e.kind == "f" and e.digest in bad:
                        path = self.store.blob_path(e.digest)
                        report.find("rows", row.state_id, f"{e.path}: blob {path} is corrupted")
        report.count("rows", len(self))
        if bench is None:
            from bat_gym.registry import get_benchmark

            bench = get_benchmark(self.manifest["benchmark"])
        rows = list(self)
        if sample is not None and sample < len(rows):
            rows = random.Random(seed).sample(rows, sample)
        _verify_replays(self, bench, rows, backend, report)
        return report

    @staticmethod
    def write(root: Path, states: Iterable[StageState], meta: dict[str, Any]) -> None:
        """Write rows and manifest into ``root`` (whose ``store/`` already holds the blobs)."""
        lines = "".join(s.model_dump_json() + "\n" for s in states).encode()
        manifest = {
            "format": BANK_FORMAT,
            **meta,
            "rows": lines.count(b"\n"),
            "rows_sha256": hashlib.sha256(lines).hexdigest(),
        }
        # Rows first, manifest last, each by rename: a reader sees the old bank, a
        # digest mismatch (refused), or the new bank; never a half-written file.
        _write_atomic(root / "rows.jsonl", lines)
        _write_atomic(
            root / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode()
        )


@dataclass
class BankReport:
    """What a bank check looked at and what it found.

    Attributes:
        title: the check's name (``verify``, ``audit``).
        checked: per check, how many things were looked at.
        findings: per check, ``(where, what)`` for each problem found.
    """

    title: str
    checked: dict[str, int] = field(default_factory=dict)
    findings: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not any(self.findings.values())

    def count(self, check: str, n: int = 1) -> None:
        """Record that ``n`` more things were looked at by ``check``."""
        self.checked[check] = self.checked.get(check, 0) + n
        self.findings.setdefault(check, [])

    def find(self, check: str, where: str, what: str) -> None:
        """Record a problem found by ``check`` at ``where``."""
        self.findings.setdefault(check, []).append((where, what))
        self.checked.setdefault(check, 0)

    def table(self) -> str:
        """A plain-text table: one line per check, then one per finding."""
        width = max([len(c) for c in self.checked] + [5])
        lines = [f"{'check':{width}}  {'checked':>8}  {'found':>6}"]
        for check in self.checked:
            lines.append(
                f"{check:{width}}  {self.checked[check]:>8}  {len(self.findings[check]):>6}"
            )
        for check, found in self.findings.items():
            lines += [f"  {check}: {where}: {what}" for where, what in found]
        lines.append(f"{self.title}: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


def _verify_store(store: BlobStore, report: BankReport) -> set[str]:
    """Rehash every blob and reparse every snapshot manifest; return the bad blobs' names."""
    bad: set[str] = set()
    for path in sorted((store.root / "blobs").glob("*/*")):
        name = path.parent.name + path.name
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        report.count("blobs")
        if digest != name:
            bad.add(name)
            report.find("blobs", str(path), f"content sha256 is {digest}, not its name")
    for path in sorted((store.root / "snapshots").glob("*.json")):
        report.count("snapshots")
        try:
            snap = Snapshot.model_validate_json(path.read_text())
        except ValueError as exc:
            report.find("snapshots", str(path), f"not a valid snapshot manifest: {exc}")
            continue
        if snap.digest != path.stem:
            report.find("snapshots", str(path), f"manifest digest is {snap.digest}, not its name")
        for e in snap.entries:
            if e.kind == "f" and not store.blob_path(e.digest).is_file():
                report.find("snapshots", str(path), f"{e.path}: blob {e.digest} is missing")
    return bad


def _verify_replays(
    bank: StageBank,
    bench: Benchmark,
    rows: list[StageState],
    backend: str,
    report: BankReport,
) -> None:
    """Replay each sampled row's trajectory once and compare boundary digests."""
    protocol = bank.manifest.get("protocol", "hermes")
    if bank.manifest.get("version") != bench.spec.version:
        report.find(
            "replay",
            str(bank.root / "manifest.json"),
            f"bank is of {bench.name} {bank.manifest.get('version')}, "
            f"the installed benchmark is {bench.spec.version}",
        )
        return
    groups: dict[tuple[str, str], list[StageState]] = {}
    for row in rows:
        groups.setdefault((row.task_id, row.outcome), []).append(row)
    for group in groups.values():
        first = group[0]
        seed, split = first.provenance.get("seed"), first.provenance.get("split", "train")
        with tempfile.TemporaryDirectory(prefix="bat-gym-verify-") as tmp:
            # A private store: a replay must never write into the bank it checks.
            store = BlobStore(Path(tmp) / "store")
            reduction = first.provenance.get("reduction")
            try:
                start = _initial_state(
                    bench,
                    seed,
                    first.track,
                    store,
                    protocol,
                    split,
                    outcome=first.outcome,
                    reduction=reduction,
                )
            except ValueError as exc:
                report.find("replay", first.task_id, f"cannot regenerate the task: {exc}")
                continue
            seen = {E2E: start.snapshot}
            task = bench.task_of(first.track, seed, split, reduction)
            if any(r.focus != E2E for r in group):
                reason, _ = _replay(
                    bench,
                    task,
                    first.outcome,
                    start,
                    store,
                    backend=backend,
                    protocol=protocol,
                    on_boundary=lambda stage, env, seen=seen: seen.setdefault(
                        stage, env.unwrapped.sandbox.capture().digest
                    ),
                    score=False,
                )
                if reason is not None:
                    report.find("replay", first.task_id, f"replay failed: {reason}")
        for row in group:
            report.count("replay")
            got = seen.get(row.focus)
            if got is None:
                report.find("replay", row.state_id, f"the replay never reached {row.focus}")
            elif got != row.snapshot:
                report.find(
                    "replay",
                    row.state_id,
                    f"workspace digest at the {row.focus} boundary is {got}, row says {row.snapshot}",
                )


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` by fsynced temporary file and rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class _MemoryStates(_StateLookup):
    """A StateSource over states held in memory (while building, and for evaluation)."""

    def __init__(self, store: BlobStore, states: list[StageState]) -> None:
        self.store = store
        self._rows = {s.state_id: s for s in states}


def task_states(
    bench: Benchmark,
    tasks: Iterable[tuple[str, int]],
    split: Split,
    store: BlobStore,
    *,
    protocol: str = "hermes",
) -> StateSource:
    """E2E start states of the given ``(track, seed)`` tasks, held in memory.

    For evaluating on held-out tasks, which never enter a bank: pass the result as
    ``states=`` to an E2E env and reset with ``options={"state_id": ...}`` (ids from
    ``select()``). Each task's public files are captured into ``store``; the state pins
    the benchmark's E2E contract and records split and seed, so its task (and task
    metric) can be regenerated for scoring.
    """
    states = [_initial_state(bench, seed, track, store, protocol, split) for track, seed in tasks]
    return _MemoryStates(store, states)


def _initial_state(
    bench: Benchmark,
    task_seed: int,
    track: str,
    store: BlobStore,
    protocol_name: str,
    split: Split = "train",
    *,
    outcome: str = "success",
    reduction: dict[str, Any] | None = None,
) -> StageState:
    """The E2E start state of a task (reduced as ``reduction`` says, for a surrogate).

    Raises:
        ValueError: a reduction is asked for and the benchmark has no reduced form.
    """
    from bat_gym.protocol import get_protocol

    task = bench.task_of(track, task_seed, split, reduction)
    if task is None:
        raise ValueError(f"{bench.name} has no reduced form of its tasks")
    with tempfile.TemporaryDirectory(prefix="bat-gym-task-") as tmp:
        bench.write_public_files(task, Path(tmp))
        snap = WorkspaceIndex(tmp).capture(store)
    protocol = get_protocol(protocol_name)
    messages = (
        {"role": "system", "content": bench.system_prompt(E2E, protocol)},
        {"role": "user", "content": bench.user_prompt(task, E2E)},
    )
    provenance: dict[str, Any] = {
        "split": split,
        "seed": task_seed,
        "teacher": "scripted",
        "tier": task.tier,
    }
    state_id = f"{task.task_id}.{E2E}.{outcome}"
    if reduction:
        provenance["reduction"] = dict(reduction)
        state_id += f".{SURROGATE}"
    return StageState(
        state_id=state_id,
        benchmark=bench.name,
        benchmark_version=bench.spec.version,
        focus=E2E,
        track=track,
        outcome=outcome,
        task_id=task.task_id,
        messages=messages,
        snapshot=snap.digest,
        contract=bench.contract_ref(E2E),
        # Training seeds are not secret; held-out seeds never reach a bank (only the
        # in-memory states of task_states, for evaluation).
        provenance=provenance,
    )


def _teacher(bench: Benchmark, task: Any, outcome: str) -> list[Any]:
    """The teacher's turns for ``outcome``; a benchmark with only success is asked plainly."""
    if tuple(bench.outcomes) == ("success",):
        return bench.teacher_turns(task)
    return bench.teacher_turns(task, outcome=outcome)  # type: ignore[call-arg]


def _replay(
    bench: Benchmark,
    task: Any,
    outcome: str,
    start: StageState,
    store: BlobStore,
    *,
    backend: str,
    protocol: str,
    on_boundary: Callable[[str, Any], None],
    score: bool,
) -> tuple[str | None, float | None]:
    """Step the teacher through a real E2E env from ``start``, calling back at stage boundaries.

    ``on_boundary(stage, env)`` runs before the first turn of each stage. Returns a
    rejection reason (None when the trajectory ran to finish) and, when ``score``, the
    E2E rubric reward of the finished episode (a null verdict counts as 0).
    """
    from bat_gym.env import StageEnv
    from bat_gym.protocol import get_protocol
    from bat_gym.rubrics.reward import RubricReward

    proto = get_protocol(protocol)
    base = StageEnv(
        E2E,
        benchmark=bench,
        states=_MemoryStates(store, [start]),
        backend=backend,
        protocol=protocol,
    )
    env = RubricReward(base) if score else base
    try:
        env.reset(options={"state_id": start.state_id})
        current = None
        terminated = truncated = False
        for turn in _teacher(bench, task, outcome):
            if turn.stage != current and turn.stage != E2E:
                current = turn.stage
                on_boundary(current, env)
            _, _, terminated, truncated, _ = env.step(proto.render(turn.content, list(turn.calls)))
            if terminated or truncated:
                break
        if truncated:
            return "teacher ran out of budget", None
        if not terminated:
            return "teacher did not call finish", None
        if not score:
            return None, None
        verdict = env.last_verdict  # type: ignore[union-attr]
        return None, float(verdict.reward or 0.0) if verdict is not None else 0.0
    finally:
        env.close()


def _task_key(track: str, seed: int, outcome: str) -> str:
    return f"{track}/{seed}/{outcome}"


def _surrogate_key(track: str, seed: int, max_cases: int) -> str:
    return f"{track}/{seed}/{SURROGATE}/{max_cases}"


class _Journal:
    """``rows.partial.jsonl``: one line per finished task, appended and fsynced.

    The first line is a header naming the build; every later line is one task's
    record (its rows, or why it was rejected). A task's rows share one line, so a
    build killed mid-write leaves at most one torn last line, which is cut off on the
    next open: a half-written task is never admitted, and a rerun redoes it.
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
) -> StageBank:
    """Build a bank of every focus x track x outcome from training seeds.

    For each task and outcome the teacher's turns are stepped through a real E2E env;
    before the first turn of each stage the workspace is captured as that stage's start
    state. ``tracks`` limits the bank to those tracks (default: all of the spec's).

    Outcomes the benchmark does not declare in :attr:`Benchmark.outcomes` are not
    built (the teacher is never asked for them); the manifest lists them under
    ``unsupported_outcomes``. Only trajectories the verifier agrees with are kept: a
    success trajectory must reach an E2E rubric reward of at least
    :data:`SUCCESS_MIN_REWARD`; recovery and failure trajectories are kept as
    labelled. Rejections are counted by reason in the manifest's ``rejected``.

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
        outcomes: the teacher outcomes to build.
        surrogates: per track, how many extra E2E surrogate rows to build: the
            first training seeds' tasks reduced with :meth:`Benchmark.reduce_task`
            to ``surrogate_cases`` cases, replayed by the success teacher and kept
            only at an E2E reward of at least :data:`SUCCESS_MIN_REWARD`. Their state
            ids end in ``.surrogate`` and their provenance records the reduction;
            the manifest's ``surrogates`` counts planned, kept and rejected ones.
        surrogate_cases: the cases a surrogate task keeps.

    Raises:
        BankError: ``root`` holds an unfinished build with different settings.
        ValueError: an unknown outcome, or a negative ``surrogates`` or a
            ``surrogate_cases`` below 1.
    """
    if surrogates < 0 or surrogate_cases < 1:
        raise ValueError(
            f"surrogates must be >= 0 and surrogate_cases >= 1, got {surrogates}, {surrogate_cases}"
        )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(root / "store")
    seeds = list(bench.seeds("train"))[:tasks_per_track]
    track_names = list(tracks or [t.name for t in bench.spec.tracks])
    for track in track_names:
        bench.spec.track(track)  # an unknown name fails here, naming the known ones
    wanted = list(dict.fromkeys(outcomes))
    unknown = [o for o in wanted if o not in OUTCOMES]
    if unknown:
        raise ValueError(f"unknown outcome(s) {unknown}; choose from {list(OUTCOMES)}")
    supported = [o for o in wanted if o in bench.outcomes]
    header = {
        "benchmark": bench.name,
        "version": bench.spec.version,
        "format": BANK_FORMAT,
        "protocol": protocol,
    }
    journal = _Journal(root / "rows.partial.jsonl", header)
    plan = [(t, s, o) for t in track_names for s in seeds for o in supported]
    surrogate_seeds = list(bench.seeds("train"))[:surrogates]
    surrogate_plan = [(t, s) for t in track_names for s in surrogate_seeds]
    reduction = {"max_cases": surrogate_cases}
    try:
        for track, seed, outcome in plan:
            key = _task_key(track, seed, outcome)
            if key not in journal.done:
                journal.add(_build_task(bench, track, seed, outcome, store, backend, protocol))
        for track, seed in surrogate_plan:
            key = _surrogate_key(track, seed, surrogate_cases)
            if key not in journal.done:
                record = _build_task(
                    bench, track, seed, "success", store, backend, protocol, reduction=reduction
                )
                journal.add({**record, "key": key})
    finally:
        journal.close()
    states: list[StageState] = []
    rejected: Counter[str] = Counter()
    for track, seed, outcome in plan:
        record = journal.done[_task_key(track, seed, outcome)]
        if record.get("rejected"):
            rejected[record["rejected"]] += 1
            continue
        where = f"{journal.path}:{record['key']}"
        states += [load_model(StageState, r, origin=where) for r in record["rows"]]
    extra: dict[str, Any] = {}
    if surrogate_plan:
        surrogate_rejected: Counter[str] = Counter()
        for track, seed in surrogate_plan:
            record = journal.done[_surrogate_key(track, seed, surrogate_cases)]
            if record.get("rejected"):
                surrogate_rejected[record["rejected"]] += 1
                continue
            where = f"{journal.path}:{record['key']}"
            states += [load_model(StageState, r, origin=where) for r in record["rows"]]
        extra["surrogates"] = {
            "per_track": surrogates,
            "reduction": reduction,
            "planned": len(surrogate_plan),
            "kept": len(surrogate_plan) - sum(surrogate_rejected.values()),
            "rejected": dict(sorted(surrogate_rejected.items())),
        }
    StageBank.write(
        root,
        states,
        {
            **header,
            "tasks_per_track": tasks_per_track,
            "tracks": track_names,
            "outcomes": supported,
            "unsupported_outcomes": [o for o in wanted if o not in supported],
            "trajectories": {"planned": len(plan), "kept": len(plan) - sum(rejected.values())},
            "rejected": dict(sorted(rejected.items())),
            "success_min_reward": SUCCESS_MIN_REWARD,
            **extra,
        },
    )
    return StageBank(root)


def _build_task(
    bench: Benchmark,
    track: str,
    seed: int,
    outcome: str,
    store: BlobStore,
    backend: str,
    protocol: str,
    *,
    reduction: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One task's journal record: its stage rows, or the reason it was rejected.

    With ``reduction`` the task is the reduced one and only its E2E row is kept (an
    E2E surrogate); the teacher still runs the whole episode, which is scored.
    """
    from bat_gym.protocol import get_protocol

    proto = get_protocol(protocol)
    key = _task_key(track, seed, outcome)
    try:
        start = _initial_state(
            bench, seed, track, store, protocol, outcome=outcome, reduction=reduction
        )
    except ValueError:
        return {"key": key, "rejected": "no reduced form", "reward": None}
    task = bench.task_of(track, seed, "train", reduction)
    states = [start]

    def boundary(stage: str, env: Any) -> None:
        if not reduction:
            states.append(_stage_state(bench, task, env, stage, start, proto))

    reason, reward = _replay(
        bench,
        task,
        outcome,
        start,
        store,
        backend=backend,
        protocol=protocol,
        on_boundary=boundary,
        score=True,
    )
    if reason is None and outcome == "success" and (reward or 0.0) < SUCCESS_MIN_REWARD:
        reason = f"success below reward {SUCCESS_MIN_REWARD}"
    if reason is not None:
        return {"key": key, "rejected": reason, "reward": reward}
    return {"key": key, "reward": reward, "rows": [s.model_dump(mode="json") for s in states]}


def _stage_state(
    bench: Benchmark, task: Any, env: Any, stage: str, start: StageState, proto: Any
) -> StageState:
    """The start state of ``stage``: the workspace now, and the conversation so far."""
    snap = env.unwrapped.sandbox.capture()
    head = (
        {"role": "system", "content": bench.system_prompt(stage, proto)},
        {"role": "user", "content": bench.user_prompt(task, stage)},
    )
    room = bench.spec.budgets.max_prompt_chars - sum(len(m["content"]) for m in head)
    messages = (*head, *fit_history(env.unwrapped.messages[2:], room))
    return start.model_copy(
        update={
            "state_id": f"{task.task_id}.{stage}.{start.outcome}",
            "focus": stage,
            "messages": messages,
            "snapshot": snap.digest,
            "contract": bench.contract_ref(stage),
        }
    )


def _turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group messages into turns: an assistant message and the messages answering it."""
    turns: list[list[dict[str, Any]]] = []
    for m in messages:
        if m["role"] == "assistant" or not turns:
            turns.append([])
        turns[-1].append(m)
    return turns


def fit_history(messages: list[dict[str, Any]], room_chars: int) -> list[dict[str, Any]]:
    """Keep the most recent whole turns of ``messages`` that fit in ``room_chars``.

    Turns are kept whole (a tool result never loses its call). When turns are dropped a
    note saying how many opens the history, so the prompt never pretends to be complete.
    """
    turns = _turns(list(messages))
    kept: list[list[dict[str, Any]]] = []
    used = 0
    for turn in reversed(turns):
        size = sum(len(m.get("content") or "") + len(str(m.get("tool_calls") or "")) for m in turn)
        if used + size > room_chars:
            break
        kept.append(turn)
        used += size
    kept.reverse()
    dropped = len(turns) - len(kept)
    note = [
        {
            "role": "user",
            "content": f"[{dropped} earlier turn(s) omitted; their files are in /workspace]",
        }
    ]
    return (note if dropped else []) + [m for turn in kept for m in turn]


def cache_dir() -> Path:
    """bat_gym's cache (``BAT_GYM_CACHE``, else ``$XDG_CACHE_HOME/bat_gym``)."""
    base = os.environ.get("BAT_GYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "bat_gym"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_bank(bench: Benchmark) -> StageBank:
    """The benchmark's default bank, built on first use and cached.

    Concurrent first uses (vector-env workers) wait on a lock; one builds.
    """
    from bat_gym import __version__

    # Rows pin contract digests, so an edited contract must not reuse an old bank.
    contracts = [ref.sha256 for f in bench.spec.focuses if (ref := bench.contract_ref(f))]
    key = hashlib.sha256(
        f"{bench.name}/{bench.spec.version}/{__version__}/{BANK_FORMAT}/{contracts}".encode()
    ).hexdigest()[:12]
    root = cache_dir() / "banks" / f"{bench.name}-{key}"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "manifest.json").exists():
            with contextlib.suppress(Exception):
                return StageBank(root)
            shutil.rmtree(root, ignore_errors=True)
        tmp = root.with_name(root.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        build_bank(bench, tmp)
        os.replace(tmp, root)
    return StageBank(root)
