"""The provided model's own outputs, computed by the verifier out of band.

Shape is cheap to fake: a file with the right columns and case ids, a receipt with the
real sha256 of that file. What the agent cannot produce without doing the work is what
the task's own pipeline produces on the task's own inputs. So the verifier runs the
benchmark's reference script (by default the teacher's ``success`` workflow,
:meth:`~bat_gym.benchmark.Benchmark.reference_script`) in a fresh sandbox on the
pristine task files, outside every episode, and checks compare the agent's artifacts
with what that run left (:mod:`.reference_checks`).

The shipped models are deterministic numpy, so a reference run is a pure function of
the task: it is computed once per task and kept in bat_gym's cache
(``<cache>/references/<benchmark>/``), keyed by the task id, the digest of its pristine
files, the script, and what the sandbox has inside (the interpreter and the versions of
the benchmark's packages), so a changed generator, teacher or environment never reuses
a stale run, and two venvs can share one cache. Held-out tasks are run like any other,
on the evaluation's side of the firewall: only verdicts leave it.

:func:`reproduce` is the other half: reproduce, don't trust. It runs the benchmark's
:meth:`~bat_gym.benchmark.Benchmark.reproduction_command` (the agent's shipped
pipeline on every case) in a fresh sandbox holding the agent's final workspace with the
task's inputs put back as they were, so the pipeline that is shipped is what gets
credit, not whatever ran in memory during the episode or a file written by hand.

:func:`task_oracle` hands both, with the benchmark's answers and metrics, to the checks
as a :class:`~bat_gym.rubrics.contract.context.TaskOracle`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import posixpath
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bat_gym.core.errors import WorkspaceRejected
from bat_gym.core.files import cache_dir, write_atomic
from bat_gym.core.sandbox import BlobStore, Entry, Snapshot, WorkspaceIndex, make_sandbox
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.scratch import scratch_dir
from bat_gym.core.spec import Task
from bat_gym.rubrics.contract.context import TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace, path_matches

if TYPE_CHECKING:
    from bat_gym.benchmark import Benchmark

__all__ = [
    "Reproduction",
    "reference_workspace",
    "reference_key",
    "reproduce",
    "adopt_reference",
    "task_oracle",
]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_MEMO: dict[tuple[str, str, str], FrozenWorkspace | None] = {}
_MEMO_MAX = 256
_RUNNING: dict[tuple[str, str, str], threading.Lock] = {}  # the reference runs under way


def _store(benchmark: Benchmark) -> BlobStore:
    return BlobStore(cache_dir() / "references" / benchmark.name)


def _pristine(benchmark: Benchmark, task: Task, store: BlobStore) -> Snapshot:
    with tempfile.TemporaryDirectory(prefix="bat-gym-reference-") as tmp:
        benchmark.write_public_files(task, Path(tmp))
        return WorkspaceIndex(tmp).capture(store)


def _runtime(benchmark: Benchmark, backend: str) -> tuple[str, ...]:
    """What the sandbox a reference run uses has inside, as far as its facts depend on it.

    A run records the versions it sees (an environment record's python and numpy), so
    two interpreters that share a cache (a second venv, an upgraded numpy) must not
    share a run. ``local`` runs this interpreter: its version and the installed
    versions of the benchmark's ``pip`` requirements. ``docker`` runs the image, whose
    key already names its packages.
    """
    return _runtime_of(benchmark.sandbox_requirements(), backend)


@functools.lru_cache(maxsize=64)
def _runtime_of(requirements: SandboxRequirements, backend: str) -> tuple[str, ...]:
    if backend == "docker":
        from bat_gym.core.sandbox.docker_image import image_contents

        return (image_contents(requirements).key,)
    out = [sys.implementation.name, platform.python_version()]
    for dist in requirements.pip_names:
        try:
            out.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist} absent")
    return tuple(out)


def reference_key(
    benchmark: Benchmark, task: Task, pristine_digest: str, backend: str = "local"
) -> str | None:
    """The cache key of ``task``'s reference run, or None if the benchmark has no script.

    It names the benchmark, the task, its pristine files, the script's calls, the
    backend and what that backend's sandbox has inside (:func:`_runtime`).
    """
    script = benchmark.reference_script(task)
    if script is None:
        return None
    calls = [[c.name, c.arguments] for turn in script for c in turn.calls]
    blob = json.dumps(
        [
            benchmark.name,
            task.task_id,
            pristine_digest,
            calls,
            backend,
            list(_runtime(benchmark, backend)),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def reference_workspace(
    benchmark: Benchmark, task: Task, *, backend: str = "local"
) -> FrozenWorkspace | None:
    """The workspace the reference script leaves on ``task``'s pristine files.

    Run on ``backend``, the episode's: the facts a run records (library versions) are
    those of the sandbox it ran in.

    None when the benchmark declares no reference script, or the script failed (then a
    warning is logged: the checks that need it are null, never a guess).
    """
    store = _store(benchmark)
    memo = (str(store.root), task.task_id, backend)
    with _LOCK:
        if memo in _MEMO:
            return _MEMO[memo]
        running = _RUNNING.setdefault(memo, threading.Lock())
    # One run per task at a time: a caller that finds it under way waits for its result.
    with running:
        with _LOCK:
            if memo in _MEMO:
                return _MEMO[memo]
        result = _reference_workspace(benchmark, task, store, backend)
        with _LOCK:
            if len(_MEMO) >= _MEMO_MAX:
                _MEMO.pop(next(iter(_MEMO)))
            _MEMO[memo] = result
            _RUNNING.pop(memo, None)
    return result


def _reference_workspace(
    benchmark: Benchmark, task: Task, store: BlobStore, backend: str
) -> FrozenWorkspace | None:
    """:func:`reference_workspace` uncached in this process: from the store, or run."""
    pristine = _pristine(benchmark, task, store)
    key = reference_key(benchmark, task, pristine.digest, backend)
    result: FrozenWorkspace | None = None
    if key is not None:
        index = store.root / f"{key}.ref"
        try:
            result = FrozenWorkspace.load(store, index.read_text().strip())
        except (OSError, KeyError, ValueError):
            result = _run(benchmark, task, store, pristine, backend)
            if result is not None:
                write_atomic(index, result.digest)
    return result


def _script_calls(benchmark: Benchmark, task: Task) -> list[tuple[str, str]] | None:
    script = benchmark.reference_script(task)
    if script is None:
        return None
    return [
        (c.arguments["language"], c.arguments["code"])
        for turn in script
        for c in turn.calls
        if c.name == "execute_code"
    ]


def adopt_reference(
    benchmark: Benchmark,
    task: Task,
    start_digest: str,
    calls: Sequence[tuple[str, str, int | None]],
    final: FrozenWorkspace,
    *,
    backend: str = "local",
    unattributed: Sequence[str] = (),
) -> bool:
    """Keep an episode's final workspace as the reference run, when it is exactly one.

    An episode that started from the task's pristine files and ran exactly the
    reference script's calls, every one exiting 0, on the same backend, did what
    :func:`reference_workspace` would do (the runs are deterministic). The teacher's
    own episodes, which a Stage Bank build plays for every task, then cost no second
    run. ``calls`` are ``(language, code, exit_code)`` in order. An episode with
    ``unattributed`` paths is not adopted: those paths were removed from ``final``
    before scoring, so it lacks files the script wrote, and as the cached reference it
    would misjudge every later episode on the task. Returns whether it was adopted;
    anything else leaves the cache as it was.
    """
    store = _store(benchmark)
    memo = (str(store.root), task.task_id, backend)
    with _LOCK:
        if memo in _MEMO:
            return False
    expected = _script_calls(benchmark, task)
    if expected is None or [(lang, code) for lang, code, _ in calls] != expected:
        return False
    if unattributed or any(rc != 0 for _, _, rc in calls):
        return False
    pristine = _pristine(benchmark, task, store)
    key = reference_key(benchmark, task, pristine.digest, backend)
    if key is None or pristine.digest != start_digest:
        return False
    for e in final.snapshot.entries:
        if e.kind != "d" and not store.has(e.digest):
            store.put_bytes(final.store.read_blob(e.digest))
    store.put_snapshot(final.snapshot)
    write_atomic(store.root / f"{key}.ref", final.digest)
    adopted = FrozenWorkspace(final.snapshot, store)
    with _LOCK:
        _MEMO[memo] = adopted
    return True


def _run(
    benchmark: Benchmark, task: Task, store: BlobStore, pristine: Snapshot, backend: str
) -> FrozenWorkspace | None:
    """Play the reference script's tool calls in a fresh sandbox; capture what they leave."""
    script = benchmark.reference_script(task) or []
    with make_sandbox(
        backend, store=store, requirements=benchmark.sandbox_requirements()
    ) as sandbox:
        sandbox.restore(pristine)
        for turn in script:
            for call in turn.calls:
                if call.name != "execute_code":
                    continue
                res = sandbox.execute_code(call.arguments["language"], call.arguments["code"])
                if res.exit_code != 0:
                    log.warning(
                        "the reference script of %s failed (exit %s): %s",
                        task.task_id,
                        res.exit_code,
                        res.output[-500:],
                    )
                    return None
        final = sandbox.capture()
    return FrozenWorkspace(final, store)


# -- reproduction ---------------------------------------------------------------------


class Reproduction(FrozenWorkspace):
    """What a reproduction left, and which of the files it started from the pipeline read.

    ``read`` is the pipeline's file set as the run itself shows it: every file of the
    starting workspace other than the task's inputs that the run's processes opened
    (sources executed or imported, settings and intermediate files read), observed by
    the sandbox (:attr:`bat_gym.core.sandbox.base.Provenance.reads`). Where the sandbox
    cannot observe reads, or the run was answered by the reference run, it is every
    file the run started from: what cannot be told apart is all counted as pipeline.
    """

    def __init__(self, snapshot: Snapshot, store: BlobStore, read: frozenset[str]) -> None:
        super().__init__(snapshot, store)
        self.read = read


def _derived(path: str) -> bool:
    """A compiled-module cache file: Python writes it, and would run it instead of the source."""
    return "__pycache__" in path.split("/")


_REPRO_MAX = 4  # reproductions kept (each with its blobs in a temporary directory)
_REPRO: dict[tuple[str, str, tuple[str, ...]], tuple[Reproduction | None, str]] = {}


# A forked child inherits the table, but the directories are its parent's to delete.
os.register_at_fork(after_in_child=_REPRO.clear)


def _pristine_digest(benchmark: Benchmark, task: Task) -> str:
    key = (benchmark.name, task.task_id)
    with _LOCK:
        known = _PRISTINE.get(key)
    if known is None:
        known = _pristine(benchmark, task, _store(benchmark)).digest
        with _LOCK:
            _PRISTINE[key] = known
    return known


_PRISTINE: dict[tuple[str, str], str] = {}


def reproduce(
    benchmark: Benchmark,
    task: Task,
    final: FrozenWorkspace,
    outputs: Sequence[str],
    *,
    backend: str = "local",
    from_reference: Sequence[str] = (),
) -> Reproduction | None:
    """Run the agent's shipped pipeline again, out of band; return what it leaves.

    The sandbox (on ``backend``, the episode's) starts from ``final``, the agent's
    frozen workspace, with the task's :attr:`~bat_gym.benchmark.Benchmark.input_paths`
    put back as they were, the ``outputs`` (with everything under their top
    directory, ``outputs/``) removed and compiled-module caches (``__pycache__/``)
    dropped, so the sources are what runs, then runs the benchmark's reproduction
    command once. None when the benchmark has no such command. A pipeline that fails,
    times out, or leaves a workspace the host refuses leaves the outputs missing,
    never an exception. The result's :attr:`Reproduction.read` is the pipeline's file
    set: every kept file the run read, wherever it lives (a module that shadows an
    import at the workspace root is as much pipeline as ``pipeline/infer.py``).

    ``from_reference`` names paths (files, or folders with everything under them) that
    start as the reference run left them instead of as ``final`` holds them: what a
    later stage decides (say, the settings a pilot chooses), when the stage being
    checked is not the one that decides it.

    Runs are remembered by the digest of that starting workspace: the pipeline is
    deterministic, so the rollouts of a group that ship the same pipeline (say, on an
    Infer row whose pipeline they inherit) cost one run between them, and a workspace
    that ships exactly the reference run's files is answered by the reference run.
    """
    command = benchmark.reproduction_command(task)
    if command is None:
        return None
    return _reproduce(
        benchmark,
        task,
        final,
        outputs,
        command,
        backend,
        shortcut=True,
        from_reference=from_reference,
    )


def _reference_reads(
    benchmark: Benchmark,
    task: Task,
    ref: FrozenWorkspace,
    outputs: Sequence[str],
    backend: str,
) -> frozenset[str]:
    """What the reproduction of the reference run's own files reads, kept beside it on disk."""
    store = _store(benchmark)
    key = reference_key(benchmark, task, _pristine_digest(benchmark, task), backend)
    index = (
        store.root
        / f"{key}.{hashlib.sha256(json.dumps(list(outputs)).encode()).hexdigest()[:16]}.reads"
    )
    try:
        return frozenset(json.loads(index.read_text()))
    except (OSError, ValueError):
        pass
    command = benchmark.reproduction_command(task) or ""
    again = _reproduce(benchmark, task, ref, outputs, command, backend, shortcut=False)
    write_atomic(index, json.dumps(sorted(again.read)))
    return again.read


def _reproduce(
    benchmark: Benchmark,
    task: Task,
    final: FrozenWorkspace,
    outputs: Sequence[str],
    command: str,
    backend: str,
    *,
    shortcut: bool,
    from_reference: Sequence[str] = (),
) -> Reproduction:
    """:func:`reproduce` with the command; ``shortcut``: answer the reference's files by it."""
    inputs = benchmark.input_paths
    # The outputs' top folders (``outputs/``) and what the benchmark says to omit.
    omitted = {o.split("/", 1)[0] for o in outputs if "/" in o} | set(benchmark.reproduction_omits)

    def is_input(path: str) -> bool:
        return any(path_matches(path, p) for p in inputs)

    def is_omitted(path: str) -> bool:
        return path in outputs or any(path_matches(path, d) for d in omitted)

    def is_kept(path: str) -> bool:
        return not is_input(path) and not is_omitted(path) and not _derived(path)

    ref = reference_workspace(benchmark, task, backend=backend)
    sourced = [(e, final.store) for e in final.snapshot.entries if is_kept(e.path)]
    if from_reference and ref is not None:
        sourced = _settled_by_reference(sourced, ref, from_reference, is_kept)
    kept = [e for e, _ in sourced]
    kept_files = frozenset(e.path for e in kept if e.kind == "f")
    kept_digest = Snapshot.of(kept).digest
    if (
        shortcut
        and ref is not None
        and kept_digest == Snapshot.of([e for e in ref.snapshot.entries if is_kept(e.path)]).digest
    ):
        # The very files the reference run shipped, on the same pristine inputs: the
        # pipeline is deterministic, so running it again would give the reference's,
        # reading what the reference's own reproduction read (run once per task).
        return Reproduction(
            ref.snapshot, ref.store, _reference_reads(benchmark, task, ref, outputs, backend)
        )
    start_key = _pristine_digest(benchmark, task) + kept_digest + backend
    memo = (task.task_id, start_key, tuple(outputs))
    with _LOCK:
        if memo in _REPRO:
            return _REPRO[memo][0]  # type: ignore[return-value]
    tmp = scratch_dir("reproduce-")
    store = BlobStore(tmp)
    # The pristine files were stored once, with the task's reference: copy, not regenerate.
    known = _store(benchmark)
    inputs_of_task = [
        e for e in known.get_snapshot(_pristine_digest(benchmark, task)).entries if is_input(e.path)
    ]
    for e, source in sourced + [(e, known) for e in inputs_of_task]:
        if e.kind != "d" and not store.has(e.digest):
            store.put_bytes(source.read_blob(e.digest))
    start = Snapshot.of(kept + inputs_of_task)
    store.put_snapshot(start)
    result: Reproduction
    with make_sandbox(
        backend, store=store, requirements=benchmark.sandbox_requirements()
    ) as sandbox:
        sandbox.restore(start)
        res = sandbox.execute_code("bash", command)
        if res.exit_code != 0:
            log.info("reproduction of %s exited %s", task.task_id, res.exit_code)
        reads = res.provenance.reads
        # Only files the run started from count: what it wrote and read back is its own.
        read = kept_files if reads is None else kept_files.intersection(reads)
        try:
            result = Reproduction(sandbox.capture(), store, read)
        except WorkspaceRejected as exc:  # the outputs count as missing
            log.info("reproduction of %s left a refused workspace: %s", task.task_id, exc)
            empty = Snapshot.of([])
            store.put_snapshot(empty)
            result = Reproduction(empty, store, read)
    with _LOCK:
        while len(_REPRO) >= _REPRO_MAX:
            _, old_dir = _REPRO.pop(next(iter(_REPRO)))
            shutil.rmtree(old_dir, ignore_errors=True)
        _REPRO[memo] = (result, tmp)
    return result


def _settled_by_reference(
    sourced: list[tuple[Entry, BlobStore]],
    ref: FrozenWorkspace,
    paths: Sequence[str],
    is_kept: Callable[[str], bool],
) -> list[tuple[Entry, BlobStore]]:
    """``sourced`` with ``paths`` (and what is under them) as the reference run left them.

    What the episode left at or under ``paths`` is dropped and the reference's entries
    there are put in, with the folders that hold them; an episode entry in the way of
    such a folder (a file or link named ``validation``, say) gives way to it.
    """

    def settled(path: str) -> bool:
        return any(path_matches(path, p) for p in paths)

    theirs = [e for e in ref.snapshot.entries if settled(e.path) and is_kept(e.path)]
    folders: set[str] = set()
    for e in theirs:
        parent = posixpath.dirname(e.path)
        while parent:
            folders.add(parent)
            parent = posixpath.dirname(parent)
    out = [
        (e, store)
        for e, store in sourced
        if not settled(e.path) and not (e.path in folders and e.kind != "d")
    ]
    have = {e.path for e, _ in out}
    out += [(e, ref.store) for e in ref.snapshot.entries if e.path in folders - have]
    return out + [(e, ref.store) for e in theirs]


def task_oracle(benchmark: Benchmark, task: Task, *, backend: str = "local") -> TaskOracle:
    """What only the verifier may see about ``task`` under ``benchmark``, for the checks.

    Its private answers, ``task_score``, ``pilot_score``, ``pilot_reference_score``,
    ``risky_cases`` and ``pilot_figure``, the reference run and the reproduction of this
    module (on ``backend``), ``files_agree``, ``numeric_tolerance``, ``plan_facts`` and
    the judge; each computed on first use.
    """
    return TaskOracle(
        lambda: benchmark.private_answers(task),
        lambda workspace: benchmark.task_score(task, workspace),
        lambda workspace, path: benchmark.pilot_score(task, workspace, path),
        # On the episode's backend: its sandbox records the versions it really has.
        reference=lambda: reference_workspace(benchmark, task, backend=backend),
        files_agree=lambda path, mine, ref: benchmark.files_agree(task, path, mine, ref),
        reproduce=lambda final, outputs, from_reference=(): reproduce(
            benchmark, task, final, outputs, backend=backend, from_reference=from_reference
        ),
        plan_facts=lambda: benchmark.plan_facts(task),
        tolerance=lambda: benchmark.numeric_tolerance(task),
        judge=benchmark.judge,
        pilot_reference=lambda ref, workspace, path: benchmark.pilot_reference_score(
            task, ref, workspace, path
        ),
        risky_cases=lambda: benchmark.risky_cases(task),
        pilot_figure=lambda workspace, path, case: benchmark.pilot_figure(
            task, workspace, path, case
        ),
    )
