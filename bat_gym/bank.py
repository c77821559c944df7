"""The Stage Bank: replayable stage states on disk, and how they are built.

A bank is a directory::

    rows.jsonl      one StageState per line
    manifest.json   benchmark, version, row count, sha256 of rows.jsonl
    store/          the blob store holding every workspace snapshot

Building runs the benchmark's teacher through a real env episode (E2E focus) for each
training task, and at every stage boundary stores the workspace snapshot and the
conversation so far: the start state of that stage's envs. Only training seeds are
used; held-out seeds never enter a bank.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from bat_gym.benchmark import Benchmark, Split
from bat_gym.errors import BankError, StateNotFound
from bat_gym.sandbox.snapshot import BlobStore, WorkspaceIndex
from bat_gym.spec import E2E, StageState, load_model

__all__ = [
    "StateSource",
    "StageBank",
    "cache_dir",
    "default_bank",
    "build_bank",
    "fit_history",
    "task_states",
]

BANK_FORMAT = 4  # 3: rows carry contract refs; 4: history fitted to the prompt budget


class StateSource(Protocol):
    """Where envs get their start states: a bank, or anything shaped like one."""

    store: BlobStore

    def get(self, state_id: str) -> StageState:
        """The state with this id; raises StateNotFound."""

    def select(self, focus: str | None = None, track: str | None = None) -> list[str]:
        """Ids of the states matching the filters, in a stable order."""


class StageBank:
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

    @staticmethod
    def write(root: Path, states: Iterable[StageState], meta: dict[str, Any]) -> None:
        """Write rows and manifest into ``root`` (whose ``store/`` already holds the blobs)."""
        lines = "".join(s.model_dump_json() + "\n" for s in states).encode()
        (root / "rows.jsonl").write_bytes(lines)
        manifest = {
            "format": BANK_FORMAT,
            **meta,
            "rows": lines.count(b"\n"),
            "rows_sha256": hashlib.sha256(lines).hexdigest(),
        }
        (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


class _MemoryStates:
    """A StateSource over states held in memory (while building, and for evaluation)."""

    def __init__(self, store: BlobStore, states: list[StageState]) -> None:
        self.store = store
        self._rows = {s.state_id: s for s in states}

    def get(self, state_id: str) -> StageState:
        try:
            return self._rows[state_id]
        except KeyError:
            raise StateNotFound(state_id, list(self._rows)[:50]) from None

    def select(self, focus: str | None = None, track: str | None = None) -> list[str]:
        return sorted(
            s.state_id
            for s in self._rows.values()
            if (focus is None or s.focus == focus) and (track is None or s.track == track)
        )


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
) -> StageState:
    from bat_gym.protocol import get_protocol

    task = bench.make_task(track, task_seed, split)
    with tempfile.TemporaryDirectory(prefix="bat-gym-task-") as tmp:
        bench.write_public_files(task, Path(tmp))
        snap = WorkspaceIndex(tmp).capture(store)
    protocol = get_protocol(protocol_name)
    messages = (
        {"role": "system", "content": bench.system_prompt(E2E, protocol)},
        {"role": "user", "content": bench.user_prompt(task, E2E)},
    )
    return StageState(
        state_id=f"{task.task_id}.{E2E}.success",
        benchmark=bench.name,
        benchmark_version=bench.spec.version,
        focus=E2E,
        track=track,
        outcome="success",
        task_id=task.task_id,
        messages=messages,
        snapshot=snap.digest,
        contract=bench.contract_ref(E2E),
        # Training seeds are not secret; held-out seeds never reach a bank (only the
        # in-memory states of task_states, for evaluation).
        provenance={"split": split, "seed": task_seed, "teacher": "scripted", "tier": task.tier},
    )


def build_bank(
    bench: Benchmark,
    root: str | Path,
    *,
    tasks_per_track: int = 1,
    backend: str = "local",
    protocol: str = "hermes",
    tracks: Sequence[str] | None = None,
) -> StageBank:
    """Build a bank of every focus x track (success outcome) from training seeds.

    For each task the teacher's turns are stepped through a real E2E env; before the
    first turn of each stage the workspace is captured as that stage's start state.
    ``tracks`` limits the bank to those tracks (default: all of the spec's).
    """
    from bat_gym.env import StageEnv
    from bat_gym.protocol import get_protocol

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(root / "store")
    proto = get_protocol(protocol)
    seeds = list(bench.seeds("train"))[:tasks_per_track]
    states: list[StageState] = []
    for track in tracks or [t.name for t in bench.spec.tracks]:
        bench.spec.track(track)  # an unknown name fails here, naming the known ones
        for seed in seeds:
            start = _initial_state(bench, seed, track, store, protocol)
            states.append(start)
            task = bench.make_task(track, seed, "train")
            env = StageEnv(
                E2E,
                benchmark=bench,
                states=_MemoryStates(store, [start]),
                backend=backend,
                protocol=protocol,
            )
            try:
                env.reset(options={"state_id": start.state_id})
                current = None
                for turn in bench.teacher_turns(task):
                    if turn.stage != current and turn.stage != E2E:
                        current = turn.stage
                        states.append(_stage_state(bench, task, env, current, start, proto))
                    _, _, terminated, truncated, info = env.step(
                        proto.render(turn.content, list(turn.calls))
                    )
                    if truncated:
                        raise RuntimeError(
                            f"teacher ran out of budget on {task.task_id} at stage {current}"
                        )
                if not terminated:
                    raise RuntimeError(f"teacher of {bench.name}/{track} did not call finish")
            finally:
                env.close()
    StageBank.write(
        root,
        states,
        {
            "benchmark": bench.name,
            "version": bench.spec.version,
            "tasks_per_track": tasks_per_track,
        },
    )
    return StageBank(root)


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
            "state_id": f"{task.task_id}.{stage}.success",
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
