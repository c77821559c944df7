"""The Stage Bank: replayable stage states on disk, and how they are built.

A bank is a directory::

    rows.jsonl          one StageState per line
    manifest.json       benchmark, version, outcomes, rejections, sha256 of rows.jsonl
    store/              the blob store holding every workspace snapshot
    rows.partial.jsonl  the build's journal: one fsynced line per finished task

Building runs a teacher (the benchmark's scripted one, or any
:class:`~bat_gym.policies.Policy`) through a real env episode (E2E focus) for each
training task, and at every stage boundary stores the workspace snapshot and the
conversation so far: the start state of that stage's envs. Every row then passes the
admission gates (:class:`Admission`: sandbox init, rollout limits, contracts, leakage)
before it is kept. Only training seeds are used; held-out seeds never enter a bank
(:mod:`bat_gym.audit` measures this afterwards). :meth:`StageBank.verify` re-checks a
bank's bytes and replays its boundaries.
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
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, get_args

from bat_gym.benchmark import Benchmark, Split
from bat_gym.errors import BankError, BatGymError, StateNotFound
from bat_gym.sandbox.snapshot import BlobStore, Snapshot, WorkspaceIndex
from bat_gym.spec import E2E, Outcome, StageState, load_model

if TYPE_CHECKING:
    from bat_gym.audit import HeldOutIndex
    from bat_gym.policies.base import Policy

__all__ = [
    "Admission",
    "BankReport",
    "GATES",
    "OUTCOMES",
    "POLICY_OUTCOMES",
    "RecordedTurn",
    "SUCCESS_MIN_REWARD",
    "StateSource",
    "StageBank",
    "cache_dir",
    "default_bank",
    "build_bank",
    "fit_history",
    "load_trajectory",
    "task_states",
]

# 3: contract refs; 4: history fitted to the prompt budget; 5: outcomes; 6: admission
# gates, policy teachers, upstream counts in provenance, manifest provenance
BANK_FORMAT = 6
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
                    # A policy-taught row replays its recorded actions; None: the script.
                    turns=load_trajectory(bank.store, first),
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
    teacher: str = "scripted",
) -> StageState:
    """The E2E start state of a task (reduced as ``reduction`` says, for a surrogate).

    ``teacher`` is recorded in the provenance: ``scripted`` or ``policy``.

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
        "teacher": teacher,
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


class RecordedTurn(NamedTuple):
    """One assistant action of a bank trajectory.

    Attributes:
        stage: the stage the action belongs to (its row boundary is before the first
            action of each stage).
        text: the whole assistant message, as the env's tool protocol writes it.
        num_tokens: the tokens the policy generated for it (None: not counted).
    """

    stage: str
    text: str
    num_tokens: int | None = None


def _scripted_turns(bench: Benchmark, task: Any, outcome: str, protocol: str) -> list[RecordedTurn]:
    """The benchmark's scripted teacher for ``outcome``, rendered in ``protocol``."""
    from bat_gym.protocol import get_protocol

    proto = get_protocol(protocol)
    return [
        RecordedTurn(t.stage, proto.render(t.content, list(t.calls)))
        for t in _teacher(bench, task, outcome)
    ]


def load_trajectory(store: BlobStore, state: StageState) -> list[RecordedTurn] | None:
    """The recorded actions a policy-taught row was built from, or None for a scripted row.

    Policy trajectories are stored as one JSON blob (``{"turns": [[stage, text,
    num_tokens], ...]}``) named by ``provenance["trajectory"]``; scripted rows are
    regenerated from the benchmark's teacher instead.
    """
    digest = state.provenance.get("trajectory")
    if not digest:
        return None
    data = json.loads(store.read_blob(digest))
    return [RecordedTurn(*t) for t in data["turns"]]


def _trajectory_blob(turns: Sequence[RecordedTurn]) -> bytes:
    return json.dumps(
        {"turns": [list(t) for t in turns]}, sort_keys=True, separators=(",", ":")
    ).encode()


@dataclass
class _Episode:
    """How a replayed trajectory ended, and the counts the admission gates check.

    Attributes:
        reason: why the trajectory is rejected (None: it ran to ``finish``).
        reward: the E2E rubric reward (when scored; a null verdict counts as 0).
        turns: assistant turns taken.
        tool_calls: tool calls run.
        pilot_runs: validation passes (see :func:`_pilot_runs`).
    """

    reason: str | None
    reward: float | None = None
    turns: int = 0
    tool_calls: int = 0
    pilot_runs: int = 0


def _validation_stage(bench: Benchmark) -> Any:
    """The stage named ``Validate`` (S3 in the reference benchmarks), or None."""
    return next((s for s in bench.spec.stages if s.name == "Validate"), None)


def _pilot_runs(bench: Benchmark, record: Any, turns: Sequence[RecordedTurn]) -> int:
    """Validation passes in a trajectory: tool calls of the Validate stage that ran the pilot.

    A call counts when it belongs to a Validate turn, names the pilot artifact (the
    stage's first artifact, ``validation/pilot.csv`` in the reference benchmarks) in
    its code, and changed the workspace. Reading the pilot back (``cat``) changes
    nothing and does not count. A pilot run hidden behind another script's name is
    not seen, so the count is a lower bound; the scripted teachers name the path.
    """
    stage = _validation_stage(bench)
    if stage is None or not stage.artifacts or record is None:
        return 0
    pilot = stage.artifacts[0]
    validate = {i for i, t in enumerate(turns) if t.stage == stage.id}
    return sum(
        1 for c in record.calls if c.turn in validate and c.changed_workspace and pilot in c.code
    )


def _play(
    bench: Benchmark,
    start: StageState,
    store: BlobStore,
    turns: Sequence[RecordedTurn],
    *,
    backend: str,
    protocol: str,
    on_boundary: Callable[[str, Any], None],
    score: bool,
) -> _Episode:
    """Step recorded turns through a real E2E env from ``start``.

    ``on_boundary(stage, env)`` runs before the first turn of each stage.
    """
    from bat_gym.env import Completion, StageEnv
    from bat_gym.rubrics.reward import RubricReward

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
        for turn in turns:
            if turn.stage != current and turn.stage != E2E:
                current = turn.stage
                on_boundary(current, env)
            _, _, terminated, truncated, _ = env.step(Completion(turn.text, turn.num_tokens))
            if terminated or truncated:
                break
        episode = _Episode(
            reason=None,
            turns=base.turns,
            tool_calls=base.tool_calls,
            pilot_runs=_pilot_runs(bench, base.record, turns),
        )
        if truncated:
            episode.reason = "teacher ran out of budget"
        elif not terminated:
            episode.reason = "teacher did not call finish"
        elif score:
            verdict = env.last_verdict  # type: ignore[union-attr]
            episode.reward = float(verdict.reward or 0.0) if verdict is not None else 0.0
        return episode
    finally:
        env.close()


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
    turns: Sequence[RecordedTurn] | None = None,
) -> tuple[str | None, float | None]:
    """Step the teacher through a real E2E env from ``start``, calling back at stage boundaries.

    ``on_boundary(stage, env)`` runs before the first turn of each stage. ``turns``
    replays recorded actions (a policy's trajectory); default: the scripted teacher's
    turns for ``outcome``. Returns a rejection reason (None when the trajectory ran to
    finish) and, when ``score``, the E2E rubric reward of the finished episode (a null
    verdict counts as 0).
    """
    if turns is None:
        turns = _scripted_turns(bench, task, outcome, protocol)
    episode = _play(
        bench,
        start,
        store,
        turns,
        backend=backend,
        protocol=protocol,
        on_boundary=on_boundary,
        score=score,
    )
    return episode.reason, episode.reward


def _files(env: Any) -> set[str]:
    """Workspace-relative paths of the files in ``env``'s sandbox now (nothing stored)."""
    return {e.path for e in env.sandbox.index.scan().entries if e.kind == "f"}


def _stage_reached(bench: Benchmark, current: int, files: set[str]) -> int:
    """The index of the stage a free policy is in, given the files that exist.

    Stage ``k + 1`` begins once every artifact of stages ``1..k`` exists (the files an
    earlier stage must leave in place for a stage row); stages are never revisited.
    """
    stages = bench.spec.stages
    k = current
    while k + 1 < len(stages) and all(a in files for s in stages[: k + 1] for a in s.artifacts):
        k += 1
    return k


def _policy_trajectory(
    bench: Benchmark,
    policy: Policy,
    start: StageState,
    store: BlobStore,
    *,
    backend: str,
    protocol: str,
) -> tuple[list[RecordedTurn], dict[str, str], str | None]:
    """Let ``policy`` play ``start``'s E2E episode and label its turns by stage.

    A free policy does not say which stage a turn belongs to, so the boundaries are
    read from the workspace: after each turn the files are listed, and the next stage
    begins with the first turn after which every artifact of the earlier stages
    (``spec.stages[i].artifacts``) exists. A stage whose artifacts appear in the same
    turn as the previous stage's has no turn of its own, and so no row; a stage that
    declares no artifacts ends where it begins.

    Returns:
        The turns (stage, message, tokens), the workspace digest at the start of each
        stage that has turns, and a rejection reason (None when the policy finished).

    Raises:
        PolicyError: the policy's backend failed (the build stops; a rerun resumes).
        BankError: the sandbox crashed during a tool call.
    """
    from bat_gym.env import StageEnv
    from bat_gym.policies.base import EpisodeContext, PolicyRequest

    env = StageEnv(
        E2E,
        benchmark=bench,
        states=_MemoryStates(store, [start]),
        backend=backend,
        protocol=protocol,
    )
    stages = bench.spec.stages
    turns: list[RecordedTurn] = []
    try:
        _, info = env.reset(options={"state_id": start.state_id})
        k = _stage_reached(bench, 0, _files(env))
        digests = {stages[k].id: env.sandbox.digest()}  # type: ignore[union-attr]
        while True:
            context = EpisodeContext(benchmark=bench, state=start, turn=info["turns"])
            request = PolicyRequest(messages=info["messages"], tools=info["tools"], context=context)
            output = policy.act(request)
            turns.append(RecordedTurn(stages[k].id, output.text, output.num_tokens))
            _, _, terminated, truncated, info = env.step(output.action())
            if any(c.restarted for c in info["record"].calls):
                # Infrastructure, not the policy's doing: stop rather than journal a verdict.
                raise BankError(start.state_id, "the sandbox crashed during a tool call; rerun")
            if terminated or truncated:
                break
            reached = _stage_reached(bench, k, _files(env))
            if reached != k:
                k = reached
                digests[stages[k].id] = env.sandbox.digest()  # type: ignore[union-attr]
        reason = None if terminated else "teacher ran out of budget"
        return turns, digests, reason
    finally:
        env.close()


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


GATES: tuple[str, ...] = (
    "sandbox init",
    "rollout limits",
    "contracts",
    "leakage",
    "validation passes",
)
"""The admission gates every row passes before it enters a bank, in the order checked."""


class Admission:
    """The per-row admission gates of a bank build.

    A row is accepted only when sandbox init, rollout-limit compliance, every stage
    contract and zero leakage pass (and, for a surrogate, its validation passes):

    ``sandbox init``
        the row's snapshot restores into a real sandbox, and the workspace there,
        every file rehashed, has the row's ``snapshot`` digest.
    ``rollout limits``
        the upstream history (``provenance["upstream"]``) has at most ``max_turns``
        turns and ``max_tool_calls`` calls; an E2E row's whole trajectory too; the
        prompt (content and tool calls, counted as :func:`fit_history` counts them)
        fits ``max_prompt_chars``.
    ``contracts``
        the row's contract loads from the benchmark's contract library with the
        pinned version and sha256, and so does every stage contract an E2E contract
        is composed of.
    ``leakage``
        the row names the train split and a training seed that is not a held-out
        seed, its task id is not a held-out task id, and no file of its snapshot is a
        held-out public file or answer (:class:`~bat_gym.audit.HeldOutIndex`, built
        once, on first use), unless its own task holds the same bytes (shared by
        design, as :func:`~bat_gym.audit.audit_bank` treats it). What this catches is
        held-out content that enters during the trajectory (a teacher that writes
        it); a generator that puts held-out bytes into a training task's own files
        passes here and in the audit alike.
    ``validation passes``
        for a surrogate whose reduction sets ``validation_passes``, the trajectory's
        pilot runs (:func:`_pilot_runs`) are within it.

    Args:
        bench: the benchmark.
        store: the store holding the rows' snapshots.
        backend: the sandbox backend of the sandbox-init gate.
        tracks: the tracks whose held-out tasks the leakage gate indexes (default:
            all). A build indexes the tracks it builds; ``bat-gym bank audit`` then
            measures the finished bank against every track.
    """

    def __init__(
        self,
        bench: Benchmark,
        store: BlobStore,
        backend: str = "local",
        *,
        tracks: Sequence[str] | None = None,
    ) -> None:
        self.bench = bench
        self.store = store
        self.backend = backend
        self.tracks = tuple(tracks or ())
        self._heldout: HeldOutIndex | None = None
        self._library: Any = None
        self._box: Any = None
        self._own_cache: dict[str, set[str]] = {}

    @property
    def heldout(self) -> HeldOutIndex:
        """The held-out index: built on first use, and kept for this process's builds."""
        if self._heldout is None:
            self._heldout = _heldout_index(self.bench, self.tracks)
        return self._heldout

    def check(self, row: StageState, episode: _Episode | None = None) -> tuple[str, str] | None:
        """The first gate ``row`` fails, as ``(gate, what)``; None when it passes all.

        Args:
            row: the candidate row.
            episode: the trajectory it came from (its turn, call and pilot counts).
        """
        episode = episode or _Episode(reason=None)
        gates: tuple[tuple[str, Callable[[StageState, _Episode], str | None]], ...] = (
            ("sandbox init", self._sandbox_init),
            ("rollout limits", self._rollout_limits),
            ("contracts", self._contracts),
            ("leakage", self._leakage),
            ("validation passes", self._validation_passes),
        )
        for gate, check in gates:
            problem = check(row, episode)
            if problem is not None:
                return gate, problem
        return None

    def close(self) -> None:
        """Release the gate's sandbox."""
        if self._box is not None:
            self._box.close()
            self._box = None

    def _sandbox_init(self, row: StageState, episode: _Episode) -> str | None:
        from bat_gym.sandbox import make_sandbox

        if self._box is None:
            self._box = make_sandbox(self.backend, store=self.store)
        try:
            self._box.restore(self.store.get_snapshot(row.snapshot))
            # A fresh index rehashes every file: the sandbox's own index trusts what its
            # restore wrote, so it would vouch for a corrupted blob.
            got = WorkspaceIndex(self._box.workspace).scan().digest
        except Exception as exc:  # noqa: BLE001 - any failure to restore is this gate's finding
            return f"restoring snapshot {row.snapshot} failed: {type(exc).__name__}: {exc}"
        if got != row.snapshot:
            return f"restored workspace digest is {got}, the row says {row.snapshot}"
        return None

    def _rollout_limits(self, row: StageState, episode: _Episode) -> str | None:
        budgets = self.bench.spec.budgets
        upstream = row.provenance.get("upstream") or {}
        counts = [("history", upstream.get("turns", 0), upstream.get("tool_calls", 0))]
        if row.focus == E2E:
            counts.append(("trajectory", episode.turns, episode.tool_calls))
        for what, turns, calls in counts:
            if turns > budgets.max_turns:
                return f"{what} has {turns} turns, the budget is {budgets.max_turns}"
            if calls > budgets.max_tool_calls:
                return f"{what} has {calls} tool calls, the budget is {budgets.max_tool_calls}"
        chars = _prompt_chars(row.messages)
        if chars > budgets.max_prompt_chars:
            return f"prompt is {chars} characters, the budget is {budgets.max_prompt_chars}"
        return None

    def _contracts(self, row: StageState, episode: _Episode) -> str | None:
        if row.contract is None:
            return None
        if self._library is None:
            self._library = self.bench.contract_library()
        try:
            contract = self._library.get(row.contract)
            for component in contract.components:
                self._library.component(component)
        except BatGymError as exc:
            return str(exc)
        return None

    def _leakage(self, row: StageState, episode: _Episode) -> str | None:
        split, seed = row.provenance.get("split"), row.provenance.get("seed")
        splits = self.bench.spec.splits
        if split != "train" or not isinstance(seed, int) or seed not in splits.train:
            return f"provenance names split {split} seed {seed}, not a training seed"
        if seed in splits.heldout:
            return f"seed {seed} is a held-out seed"
        heldout = self.heldout
        if row.task_id in heldout.task_ids:
            return f"task_id is held-out task {heldout.task_ids[row.task_id]}"
        files = {
            e.digest: e.path for e in self.store.get_snapshot(row.snapshot).entries if e.kind == "f"
        }
        leaks = heldout.leaks(files, self._own(row))
        if leaks:
            digest, where = min(leaks.items(), key=lambda kv: files[kv[0]])
            return f"{files[digest]} is held-out {where}"
        return None

    def _own(self, row: StageState) -> set[str]:
        """The fingerprints of the row's own task (regenerated, cached per task)."""
        from bat_gym.audit import task_fingerprints

        if row.task_id not in self._own_cache:
            task = self.bench.task_of_state(row)
            own = set() if task is None else task_fingerprints(self.bench, task)
            # A few tasks at a time: a build visits one task's rows together.
            if len(self._own_cache) >= 8:
                self._own_cache.pop(next(iter(self._own_cache)))
            self._own_cache[row.task_id] = own
        return self._own_cache[row.task_id]

    def _validation_passes(self, row: StageState, episode: _Episode) -> str | None:
        limit = (row.provenance.get("reduction") or {}).get("validation_passes")
        if limit is not None and episode.pilot_runs > limit:
            return f"{episode.pilot_runs} pilot runs, the surrogate allows {limit}"
        return None


# Regenerating the evaluated held-out tasks is the costly part of the gates (seconds for
# MedBench-Lite), so an index is kept per benchmark object and track set, and dies with it.
_HELDOUT: weakref.WeakKeyDictionary[Benchmark, dict[tuple[str, ...], HeldOutIndex]] = (
    weakref.WeakKeyDictionary()
)


def _heldout_index(bench: Benchmark, tracks: tuple[str, ...]) -> HeldOutIndex:
    from bat_gym.audit import HeldOutIndex

    per_bench = _HELDOUT.setdefault(bench, {})
    if tracks not in per_bench:
        per_bench[tracks] = HeldOutIndex.of(bench, tracks=tracks or None)
    return per_bench[tracks]


def _prompt_chars(messages: Iterable[dict[str, Any]]) -> int:
    """A prompt's size as :func:`fit_history` measures it: content plus tool calls."""
    return sum(len(m.get("content") or "") + len(str(m.get("tool_calls") or "")) for m in messages)


POLICY_OUTCOMES: tuple[str, ...] = ("success", "failure")
"""The labels a policy teacher's trajectory can get from the verifier."""


class _Job(NamedTuple):
    """One trajectory of a build: a task, the outcome asked for, and a reduction."""

    key: str
    track: str
    seed: int
    outcome: str | None  # None: a policy plays, and the verifier labels the outcome
    reduction: dict[str, Any] | None = None


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
    :func:`_policy_trajectory`), and its recorded actions are then replayed like the
    scripted teacher's, stored with the rows so :meth:`StageBank.verify` can replay
    them again. The verifier labels a policy's trajectory: ``success`` at an E2E
    reward of at least :data:`SUCCESS_MIN_REWARD`, else ``failure``; a label not in
    ``outcomes`` rejects it (``recovery`` cannot be told from a free policy's
    trajectory and is unsupported).

    Only trajectories the verifier agrees with are kept: a success trajectory must
    reach an E2E rubric reward of at least :data:`SUCCESS_MIN_REWARD`; recovery and
    failure trajectories of the scripted teacher are kept as labelled. Then every row
    passes the admission gates (:class:`Admission`). Rejections are counted by reason
    in the manifest's ``rejected``: whole trajectories by their reason, rows by
    ``gate <name>``; ``trajectories`` counts the trajectories the verifier kept,
    ``admission`` the rows checked and admitted.

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
            :data:`SUCCESS_MIN_REWARD`. Their state ids end in ``.surrogate`` and
            their provenance records the reduction; the manifest's ``surrogates``
            counts planned, kept and rejected ones.
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
        ValueError: an unknown outcome, a negative ``surrogates``, a
            ``surrogate_cases`` or ``workers`` below 1, or a negative
            ``surrogate_validation_passes``.
    """
    if surrogates < 0 or surrogate_cases < 1:
        raise ValueError(
            f"surrogates must be >= 0 and surrogate_cases >= 1, got {surrogates}, {surrogate_cases}"
        )
    if surrogate_validation_passes is not None and surrogate_validation_passes < 0:
        raise ValueError(
            f"surrogate_validation_passes must be >= 0 or None, got {surrogate_validation_passes}"
        )
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
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
    teacher_id = _teacher_identity(teacher)
    supported = [o for o in wanted if o in (bench.outcomes if teacher is None else POLICY_OUTCOMES)]
    header = {
        "benchmark": bench.name,
        "version": bench.spec.version,
        "format": BANK_FORMAT,
        "protocol": protocol,
        "teacher": teacher_id,
    }
    if teacher is None:
        plan = [
            _Job(_task_key(t, s, o), t, s, o) for t in track_names for s in seeds for o in supported
        ]
    else:
        # One episode per task; the verifier says which of the outcomes it is.
        plan = [_Job(_task_key(t, s, "policy"), t, s, None) for t in track_names for s in seeds]
        plan = plan if supported else []
    reduction: dict[str, Any] = {"max_cases": surrogate_cases}
    if surrogate_validation_passes is not None:
        reduction["validation_passes"] = surrogate_validation_passes
    surrogate_seeds = list(bench.seeds("train"))[:surrogates]
    surrogate_plan = [
        _Job(
            _surrogate_key(t, s, reduction), t, s, "success" if teacher is None else None, reduction
        )
        for t in track_names
        for s in surrogate_seeds
    ]
    journal = _Journal(root / "rows.partial.jsonl", header)
    builder = _Builder(
        bench, store, backend, protocol, teacher, tuple(supported), tuple(track_names)
    )
    try:
        todo = [j for j in (*plan, *surrogate_plan) if j.key not in journal.done]
        _run_jobs(builder, todo, journal, workers)
    finally:
        builder.close()
        journal.close()
    states: list[StageState] = []
    main, sur = _Tally(), _Tally()
    for job in plan:
        states += main.add(journal, job)
    extra: dict[str, Any] = {}
    if surrogate_plan:
        surrogate_rows = [row for job in surrogate_plan for row in sur.add(journal, job)]
        states += surrogate_rows
        extra["surrogates"] = {
            "per_track": surrogates,
            "reduction": reduction,
            "planned": len(surrogate_plan),
            # One row per surrogate: kept means admitted, past the verifier and the gates.
            "kept": len(surrogate_rows),
            "rejected": dict(sorted(sur.rejected.items())),
        }
    if teacher is not None:
        extra["labels"] = dict(sorted(main.labels.items()))
        extra["stages_without_turns"] = dict(sorted(main.skipped.items()))
    library = bench.contract_library()
    StageBank.write(
        root,
        states,
        {
            **header,
            "tasks_per_track": tasks_per_track,
            "tracks": track_names,
            "outcomes": supported,
            "unsupported_outcomes": [o for o in wanted if o not in supported],
            "trajectories": {"planned": len(plan), "kept": main.kept},
            "rejected": dict(sorted(main.rejected.items())),
            "success_min_reward": SUCCESS_MIN_REWARD,
            "generator": {
                "benchmark": bench.name,
                "version": bench.spec.version,
                "class": f"{type(bench).__module__}.{type(bench).__qualname__}",
            },
            "seeds": {
                "tasks": {t: seeds if plan else [] for t in track_names},
                "surrogates": {t: surrogate_seeds for t in track_names},
            },
            "reduction_grid": [reduction] if surrogate_plan else [],
            "contracts": {c.id: c.sha256 for c in sorted(library, key=lambda c: c.id)},
            "admission": {
                "gates": list(GATES),
                "rows_checked": main.checked + sur.checked,
                "rows_admitted": len(states),
            },
            "bat_gym_version": _version(),
            **extra,
        },
    )
    return StageBank(root)


def _version() -> str:
    from bat_gym import __version__

    return __version__


def _teacher_identity(teacher: Policy | None) -> str | dict[str, Any]:
    """``"scripted"``, or the policy's identity (what reproduces it, no secrets)."""
    return "scripted" if teacher is None else {"policy": teacher.identity()}


@dataclass
class _Tally:
    """Rows and counts of a plan's journal records, gathered in plan order."""

    kept: int = 0
    checked: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    def add(self, journal: _Journal, job: _Job) -> list[StageState]:
        """Count ``job``'s record and return its admitted rows."""
        record = journal.done[job.key]
        if record.get("rejected"):
            self.rejected[record["rejected"]] += 1
            return []
        self.kept += 1
        self.labels[record.get("outcome", job.outcome or "")] += 1
        self.skipped.update(record.get("stages_without_turns", []))
        self.rejected.update({f"gate {g}": n for g, n in record.get("gate_rejected", {}).items()})
        self.checked += record.get("rows_checked", len(record["rows"]))
        where = f"{journal.path}:{record['key']}"
        return [load_model(StageState, r, origin=where) for r in record["rows"]]


@dataclass
class _Builder:
    """What every task of one build shares (a forked worker inherits a copy)."""

    bench: Benchmark
    store: BlobStore
    backend: str
    protocol: str
    teacher: Policy | None
    labels: tuple[str, ...]
    tracks: tuple[str, ...]
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.bench, self.store, self.backend, tracks=self.tracks)

    def build(self, job: _Job) -> dict[str, Any]:
        """One task's journal record."""
        return _build_task(self, job, self.admission)

    def close(self) -> None:
        """Release the admission gates' sandbox."""
        self.admission.close()


_WORKER: dict[str, _Builder] = {}


def _work(job: _Job) -> dict[str, Any]:
    return _WORKER["builder"].build(job)


def _set_worker(builder: _Builder) -> None:
    from multiprocessing import util

    _WORKER["builder"] = builder
    # A pool worker leaves through os._exit, which skips atexit and __del__; the
    # finalizers of multiprocessing still run, so the gate sandbox is closed there.
    util.Finalize(builder, builder.close, exitpriority=10)


def _run_jobs(builder: _Builder, todo: list[_Job], journal: _Journal, workers: int) -> None:
    """Build every job in ``todo`` and journal each record as it arrives."""
    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            journal.add(builder.build(job))
        return
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    # Built once, here, before the fork: every worker inherits the held-out index.
    _ = builder.admission.heldout
    # Fork, not spawn: workers inherit the benchmark and policy objects as they are
    # (a benchmark defined in a script or a test need not be importable or picklable).
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_set_worker, initargs=(builder,)
    ) as pool:
        pending = {pool.submit(_work, job) for job in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                error = future.exception()
                if error is not None:
                    for other in pending:
                        other.cancel()
                    raise error
                journal.add(future.result())


def _build_task(builder: _Builder, job: _Job, admission: Admission) -> dict[str, Any]:
    """One task's journal record: its admitted rows, or the reason it was rejected.

    With a reduction the task is the reduced one and only its E2E row is kept (an
    E2E surrogate); the teacher still runs the whole episode, which is scored.
    """
    bench, store, protocol = builder.bench, builder.store, builder.protocol
    reduction = job.reduction
    scripted = builder.teacher is None
    try:
        start = _initial_state(
            bench,
            job.seed,
            job.track,
            store,
            protocol,
            outcome=job.outcome or "success",
            reduction=reduction,
            teacher="scripted" if scripted else "policy",
        )
    except ValueError:
        return {"key": job.key, "rejected": "no reduced form", "reward": None}
    task = bench.task_of(job.track, job.seed, "train", reduction)
    expected: dict[str, str] = {}
    skipped: list[str] = []
    if builder.teacher is None:
        turns = _scripted_turns(bench, task, job.outcome or "success", protocol)
    else:
        turns, expected, reason = _policy_trajectory(
            bench, builder.teacher, start, store, backend=builder.backend, protocol=protocol
        )
        if reason is not None:
            return {"key": job.key, "rejected": reason, "reward": None}
        trajectory = store.put_bytes(_trajectory_blob(turns))
        start = start.model_copy(
            update={"provenance": {**start.provenance, "trajectory": trajectory}}
        )
        played = {t.stage for t in turns}
        skipped = [s.id for s in bench.spec.stages if s.id not in played]
    states = [start]
    diverged: list[str] = []

    def boundary(stage: str, env: Any) -> None:
        if reduction:
            digest = env.unwrapped.sandbox.digest()
        else:
            states.append(_stage_state(bench, task, env, stage, start, protocol))
            digest = states[-1].snapshot
        if builder.teacher is not None and expected.get(stage) != digest:
            diverged.append(stage)

    episode = _play(
        bench,
        start,
        store,
        turns,
        backend=builder.backend,
        protocol=protocol,
        on_boundary=boundary,
        score=True,
    )
    reason, reward = episode.reason, episode.reward
    if reason is None and diverged:
        reason = "replay differs from the policy's episode"
    label = job.outcome or "success"
    if reason is None:
        if scripted:
            if label == "success" and (reward or 0.0) < SUCCESS_MIN_REWARD:
                reason = f"success below reward {SUCCESS_MIN_REWARD}"
        else:
            label = "success" if (reward or 0.0) >= SUCCESS_MIN_REWARD else "failure"
            # A surrogate stands in for a successful E2E episode: success only.
            if label not in (("success",) if reduction else builder.labels):
                reason = (
                    f"success below reward {SUCCESS_MIN_REWARD}"
                    if label == "failure"
                    else "success not requested"
                )
    if reason is not None:
        return {"key": job.key, "rejected": reason, "reward": reward}
    if reduction and "validation_passes" in reduction:
        states = [
            s.model_copy(update={"provenance": {**s.provenance, "pilot_runs": episode.pilot_runs}})
            for s in states
        ]
    if label != start.outcome:
        states = [_relabel(s, label) for s in states]
    admitted: list[dict[str, Any]] = []
    gate_rejected: Counter[str] = Counter()
    findings: list[list[str]] = []
    for state in states:
        found = admission.check(state, episode)
        if found is None:
            admitted.append(state.model_dump(mode="json"))
        else:
            gate_rejected[found[0]] += 1
            findings.append([state.state_id, *found])
    record: dict[str, Any] = {"key": job.key, "reward": reward, "rows": admitted}
    if not scripted:
        record["outcome"] = label
        record["stages_without_turns"] = skipped
    if findings:
        record.update(
            gate_rejected=dict(gate_rejected), gate_findings=findings, rows_checked=len(states)
        )
    return record


def _relabel(state: StageState, outcome: str) -> StageState:
    """``state`` with its outcome (and the outcome in its id) set to ``outcome``."""
    suffix = f".{SURROGATE}" if state.provenance.get("reduction") else ""
    return state.model_copy(
        update={"outcome": outcome, "state_id": f"{state.task_id}.{state.focus}.{outcome}{suffix}"}
    )


_NOTE_ROOM = 64  # characters kept free for fit_history's "turns omitted" note


def _stage_state(
    bench: Benchmark, task: Any, env: Any, stage: str, start: StageState, protocol: str
) -> StageState:
    """The start state of ``stage``: the workspace now, and the conversation so far."""
    from bat_gym.protocol import get_protocol

    proto = get_protocol(protocol)
    base = env.unwrapped
    snap = base.sandbox.capture()
    head = (
        {"role": "system", "content": bench.system_prompt(stage, proto)},
        {"role": "user", "content": bench.user_prompt(task, stage)},
    )
    room = bench.spec.budgets.max_prompt_chars - _prompt_chars(head)
    history = fit_history(base.messages[2:], room)
    if _prompt_chars(history) > room:
        # Turns were dropped and the note saying so tipped the history over: fit again
        # with room for the note, so the prompt stays within the budget the gate checks.
        history = fit_history(base.messages[2:], room - _NOTE_ROOM)
    return start.model_copy(
        update={
            "state_id": f"{task.task_id}.{stage}.{start.outcome}",
            "focus": stage,
            "messages": (*head, *history),
            "snapshot": snap.digest,
            "contract": bench.contract_ref(stage),
            "provenance": {
                **start.provenance,
                "upstream": {"turns": base.turns, "tool_calls": base.tool_calls},
            },
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
