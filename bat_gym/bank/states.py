"""Where envs get their start states, and how a task's E2E start state is made.

:class:`StateSource` is what an env reads states from: a :class:`~bat_gym.bank.StageBank`
on disk, or :class:`MemoryStates` (states held in memory while a bank is built, and
the held-out start states of :func:`task_states`, which never enter a bank).
:func:`initial_state` captures a task's public files and opening prompt as its E2E
start state; :func:`fit_history` trims a stage row's inherited conversation to the
prompt budget.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from bat_gym.benchmark import Benchmark, Split
from bat_gym.core.errors import ConfigError, StateNotFound
from bat_gym.core.sandbox.snapshot import BlobStore, WorkspaceIndex
from bat_gym.core.service import put_service_blobs
from bat_gym.core.spec import E2E, StageState

__all__ = [
    "SURROGATE",
    "MemoryStates",
    "StateLookup",
    "StateSource",
    "fit_history",
    "initial_state",
    "prompt_chars",
    "task_states",
]


SURROGATE = "surrogate"  # the state id suffix of an E2E surrogate row


class StateSource(Protocol):
    """Where envs get their start states: a bank, or anything shaped like one."""

    store: BlobStore

    def get(self, state_id: str) -> StageState:
        """The state with this id; raises StateNotFound."""

    def select(
        self, focus: str | None = None, track: str | None = None, outcome: str | None = None
    ) -> list[str]:
        """Ids of the states matching the filters, in a stable order."""


class StateLookup:
    """``get`` and ``select`` over ``self._rows`` (state id -> StageState)."""

    _rows: dict[str, StageState]

    def get(self, state_id: str) -> StageState:
        """The state with this id."""
        try:
            return self._rows[state_id]
        except KeyError:
            raise StateNotFound(state_id, list(self._rows)[:50]) from None

    def select(
        self, focus: str | None = None, track: str | None = None, outcome: str | None = None
    ) -> list[str]:
        """Ids of states with this focus, track and outcome (None matches any), sorted."""
        return sorted(
            s.state_id
            for s in self._rows.values()
            if (focus is None or s.focus == focus)
            and (track is None or s.track == track)
            and (outcome is None or s.outcome == outcome)
        )


class MemoryStates(StateLookup):
    """A StateSource over states held in memory (while building, and for evaluation)."""

    def __init__(self, store: BlobStore, states: list[StageState]) -> None:
        self.store = store
        self._rows = {s.state_id: s for s in states}

    def add(self, state: StageState) -> None:
        """Hold ``state`` too (replacing one of the same id); its blobs must be in the store."""
        self._rows[state.state_id] = state


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
    states = [initial_state(bench, seed, track, store, protocol, split) for track, seed in tasks]
    return MemoryStates(store, states)


def initial_state(
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
        ConfigError: a reduction is asked for and the benchmark has no reduced form.
    """
    from bat_gym.core.protocol import get_protocol

    task = bench.task_of(track, task_seed, split, reduction)
    if task is None:
        raise ConfigError(
            f"{bench.name} has no reduced form of its tasks (Benchmark.reduce_task); "
            "build without surrogates"
        )
    with tempfile.TemporaryDirectory(prefix="bat-gym-task-") as tmp:
        bench.write_public_files(task, Path(tmp))
        snap = WorkspaceIndex(tmp).capture(store)
    blobs = bench.service_blobs(task)
    service = None if blobs is None else put_service_blobs(store, blobs)
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
        service=service,
        contract=bench.contract_ref(E2E),
        # Training seeds are not secret; held-out seeds never reach a bank (only the
        # in-memory states of task_states, for evaluation).
        provenance=provenance,
    )


def prompt_chars(messages: Iterable[dict[str, Any]]) -> int:
    """A prompt's size as :func:`fit_history` measures it: content plus tool calls."""
    return sum(len(m.get("content") or "") + len(str(m.get("tool_calls") or "")) for m in messages)


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
