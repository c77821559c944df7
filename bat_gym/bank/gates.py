"""The admission gates every row of a bank passes before it is kept.

:class:`Admission` checks, in the order of :data:`GATES`: sandbox init, rollout
limits, contracts, leakage against the held-out tasks, and a surrogate's validation
passes. The held-out index the leakage gate needs (:mod:`bat_gym.bank.heldout`) is built
once per benchmark and track set (:func:`_heldout_index`).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from bat_gym.bank.heldout import HeldOutIndex, task_fingerprints
from bat_gym.bank.replay import PlayedEpisode
from bat_gym.bank.states import prompt_chars
from bat_gym.benchmark import Benchmark
from bat_gym.core.errors import BatGymError
from bat_gym.core.sandbox.snapshot import BlobStore, WorkspaceIndex
from bat_gym.core.spec import E2E, StageState

__all__ = ["GATES", "Admission"]


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
        prompt (content and tool calls, counted as :func:`~bat_gym.bank.fit_history`
        counts them) fits ``max_prompt_chars``.
    ``contracts``
        the row's contract loads from the benchmark's contract library with the
        pinned version and sha256, and so does every stage contract an E2E contract
        is composed of.
    ``leakage``
        the row names the train split and a training seed that is not a held-out
        seed, its task id is not a held-out task id, and no file of its snapshot is a
        held-out public file or answer (:class:`~bat_gym.bank.heldout.HeldOutIndex`, built
        once, on first use), unless its own task holds the same bytes (shared by
        design, as :func:`~bat_gym.audits.leakage.audit_bank` treats it). What this catches is
        held-out content that enters during the trajectory (a teacher that writes
        it); a generator that puts held-out bytes into a training task's own files
        passes here and in the audit alike.
    ``validation passes``
        for a surrogate whose reduction sets ``validation_passes``, the trajectory's
        pilot runs (:func:`~bat_gym.bank.replay._pilot_runs`) are within it.

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
        self._heldout_lock = threading.Lock()

    @property
    def heldout(self) -> HeldOutIndex:
        """The held-out index: built on first use, and kept for this process's builds."""
        with self._heldout_lock:  # a prefetch may be building it: wait for that one
            if self._heldout is None:
                self._heldout = _heldout_index(self.bench, self.tracks)
            return self._heldout

    def prefetch(self) -> None:
        """Start building the held-out index in a thread, for the leakage gate to find ready.

        Regenerating held-out tasks is CPU work while a trajectory's episode mostly waits
        on its sandbox, so the two overlap. A failure here is left for the gate to meet.
        """

        def build() -> None:
            with contextlib.suppress(Exception):
                _ = self.heldout

        threading.Thread(target=build, name="bat-heldout-index", daemon=True).start()

    def check(
        self, row: StageState, episode: PlayedEpisode | None = None
    ) -> tuple[str, str] | None:
        """The first gate ``row`` fails, as ``(gate, what)``; None when it passes all.

        Args:
            row: the candidate row.
            episode: the trajectory it came from (its turn, call and pilot counts).
        """
        episode = episode or PlayedEpisode(reason=None)
        gates: tuple[tuple[str, Callable[[StageState, PlayedEpisode], str | None]], ...] = (
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

    def _sandbox_init(self, row: StageState, episode: PlayedEpisode) -> str | None:
        from bat_gym.core.sandbox import make_sandbox

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

    def _rollout_limits(self, row: StageState, episode: PlayedEpisode) -> str | None:
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
        chars = prompt_chars(row.messages)
        if chars > budgets.max_prompt_chars:
            return f"prompt is {chars} characters, the budget is {budgets.max_prompt_chars}"
        return None

    def _contracts(self, row: StageState, episode: PlayedEpisode) -> str | None:
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

    def _leakage(self, row: StageState, episode: PlayedEpisode) -> str | None:
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
        if row.task_id not in self._own_cache:
            task = self.bench.task_of_state(row)
            own = set() if task is None else task_fingerprints(self.bench, task)
            # A few tasks at a time: a build visits one task's rows together.
            if len(self._own_cache) >= 8:
                self._own_cache.pop(next(iter(self._own_cache)))
            self._own_cache[row.task_id] = own
        return self._own_cache[row.task_id]

    def _validation_passes(self, row: StageState, episode: PlayedEpisode) -> str | None:
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
    per_bench = _HELDOUT.setdefault(bench, {})
    if tracks not in per_bench:
        per_bench[tracks] = HeldOutIndex.of(bench, tracks=tracks or None)
    return per_bench[tracks]
