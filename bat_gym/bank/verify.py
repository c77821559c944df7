"""Checking a bank: its blobs and snapshot manifests, and a replay of its boundaries.

:meth:`~bat_gym.bank.StageBank.verify` rehashes the store (:func:`verify_store`) and
replays each sampled task's trajectory in a private store (:func:`verify_replays`),
comparing the workspace digest at every stage boundary with the row's snapshot, and
plays each sampled row's stored demonstration again (:func:`verify_demonstrations`).
The findings go into a :class:`BankReport`, which :mod:`bat_gym.audits.leakage` fills as well.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bat_gym.bank.policy_teacher import load_trajectory
from bat_gym.bank.replay import replay_teacher
from bat_gym.bank.states import initial_state
from bat_gym.benchmark import Benchmark
from bat_gym.core.sandbox.snapshot import BlobStore, Snapshot
from bat_gym.core.spec import E2E, StageState

__all__ = ["BankReport", "verify_demonstrations", "verify_replays", "verify_store"]


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


def verify_store(store: BlobStore, report: BankReport) -> set[str]:
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


def verify_replays(
    bench: Benchmark,
    rows: list[StageState],
    *,
    manifest: Mapping[str, Any],
    origin: str,
    bank_store: BlobStore,
    backend: str,
    report: BankReport,
) -> None:
    """Replay each row's trajectory once and compare boundary digests.

    Args:
        bench: the benchmark the rows are of.
        rows: the rows to check (a bank's, or a sample of them).
        manifest: the bank's manifest (its protocol and benchmark version).
        origin: where the manifest is, for findings about it.
        bank_store: the bank's store, which holds the recorded trajectories of
            policy-taught rows; it is only read (each replay writes a private one).
        backend: the sandbox backend to replay in.
        report: where the findings go.
    """
    protocol = manifest.get("protocol", "hermes")
    if manifest.get("version") != bench.spec.version:
        report.find(
            "replay",
            origin,
            f"bank is of {bench.name} {manifest.get('version')}, "
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
                start = initial_state(
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
                reason, _ = replay_teacher(
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
                    turns=load_trajectory(bank_store, first),
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


def verify_demonstrations(
    bench: Benchmark,
    rows: list[StageState],
    *,
    manifest: Mapping[str, Any],
    bank_store: BlobStore,
    backend: str,
    report: BankReport,
) -> None:
    """Play each row's stored demonstration again; report those below the admission bar.

    A row is in the bank because its demonstration, played from the row and scored by
    the row's contract, earned at least
    :data:`~bat_gym.bank.demonstrate.ADMIT_MIN_SHARE` of its attainable reward. Edited
    contracts, checks or teachers can change that: each replay that no longer
    reaches the bar (or cannot be read, or no longer finishes) is a finding under
    ``demonstrations``, with the reward it earns now and the one it earned at build.

    Args:
        bench: the benchmark the rows are of.
        rows: the rows to check.
        manifest: the bank's manifest (its protocol).
        bank_store: the bank's store (only read).
        backend: the sandbox backend to replay in.
        report: where the findings go.
    """
    from bat_gym.bank.demonstrate import Demonstrator

    if manifest.get("version") != bench.spec.version:
        return  # reported by verify_replays; a replay would score another benchmark
    protocol = manifest.get("protocol", "hermes")
    with Demonstrator(bench, bank_store, backend=backend, protocol=protocol) as demonstrator:
        for row in rows:
            _verify_demonstration(demonstrator, row, bank_store, report)


def _verify_demonstration(
    demonstrator: Any, row: StageState, bank_store: BlobStore, report: BankReport
) -> None:
    """Replay one row's demonstration into ``report``."""
    from bat_gym.bank.demonstrate import replay_demonstration

    report.count("demonstrations")
    built = (row.provenance.get("demonstration") or {}).get("reward")
    try:
        demo = replay_demonstration(demonstrator, row, bank_store)
    except Exception as exc:  # noqa: BLE001 - a broken demonstration is a finding
        report.find("demonstrations", row.state_id, f"cannot replay: {type(exc).__name__}: {exc}")
        return
    if demo is None:
        report.find(
            "demonstrations",
            row.state_id,
            "no stored demonstration (a bank built before format 7: rebuild it)",
        )
    elif demo.refusal is not None:
        was = "?" if built is None else f"{built:.3f}"
        report.find(
            "demonstrations",
            row.state_id,
            f"no longer reaches the bar: {demo.describe()}; at build it earned {was}",
        )
