"""A Stage Bank on disk: loading it, checking its digest, writing it atomically.

A bank is a directory::

    rows.jsonl          one StageState per line
    manifest.json       benchmark, version, outcomes, rejections, sha256 of rows.jsonl
    store/              the blob store holding every workspace snapshot
    rows.partial.jsonl  the build's journal: one fsynced line per finished task

:data:`BANK_FORMAT` numbers the layout; :meth:`StageBank.verify` re-checks a bank's
bytes and replays its boundaries (:mod:`bat_gym.bank.verify`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bat_gym.bank.states import StateLookup
from bat_gym.bank.verify import BankReport, verify_demonstrations, verify_replays, verify_store
from bat_gym.benchmark import Benchmark
from bat_gym.core.errors import BankError
from bat_gym.core.files import write_atomic
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import StageState, first_problem, load_model

__all__ = ["BANK_FORMAT", "BankManifest", "StageBank"]


# 3: contract refs; 4: history fitted to the prompt budget; 5: outcomes; 6: admission
# gates, policy teachers, upstream counts in provenance, manifest provenance; 7: rows
# admitted by a demonstration, stored with them (provenance["demonstration"])
BANK_FORMAT = 7


class BankManifest(BaseModel):
    """``manifest.json`` of a bank: what was built, from what, and the digest of its rows.

    The build writes more than these fields (counts, seeds, admission figures; see
    :func:`~bat_gym.bank.build_bank`); they are kept as written (``extra``) and shown by
    ``bat-gym bank``. The fields here are the ones code reads, checked on load.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    format: int = Field(ge=1, description="The bank layout's number (:data:`BANK_FORMAT`).")
    benchmark: str = Field(min_length=1, description="The benchmark the bank was built from.")
    version: str = Field(description="The benchmark's spec version at build time.")
    protocol: str = Field("hermes", description="The tool protocol the trajectories speak.")
    teacher: str | dict[str, Any] = Field(
        "scripted", description="``scripted``, or the policy teacher's identity."
    )
    tracks: list[str] = Field(default_factory=list, description="The tracks built.")
    outcomes: list[str] = Field(default_factory=list, description="The outcomes built.")
    rows: int = Field(ge=0, description="Lines of rows.jsonl.")
    rows_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of rows.jsonl.")


class StageBank(StateLookup):
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
        if self.root.exists() and not self.root.is_dir():
            raise BankError(
                str(self.root),
                "a file, not a Stage Bank directory; give the directory `bat-gym bank build "
                "--out DIR` made",
            )
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
        try:
            info = BankManifest.model_validate(manifest)
        except ValidationError as exc:
            raise BankError(
                str(self.root / "manifest.json"),
                f"not a bank manifest: {first_problem(exc)}; rebuild the bank with "
                "`bat-gym bank build --out DIR`",
            ) from None
        if hashlib.sha256(data).hexdigest() != info.rows_sha256:
            raise BankError(
                str(rows_path),
                "rows.jsonl does not match the digest in manifest.json (edited or corrupted)",
            )
        self.store = BlobStore(self.root / "store")
        self.info = info
        """The manifest, checked (:class:`BankManifest`)."""
        self.manifest: dict[str, Any] = manifest
        """The manifest as written, every key of the build included."""
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
        row's snapshot; and the row's stored demonstration is played again from the
        row and scored by its contract, and must still reach the admission bar
        (:data:`~bat_gym.bank.demonstrate.ADMIT_MIN_SHARE` of the attainable reward).
        The bank itself is only read.

        Args:
            sample: how many rows to replay (None: all).
            seed: the seed of the sample's choice.
            backend: the sandbox backend to replay in.
            bench: the benchmark (default: the registered one the manifest names).
        """
        report = BankReport("verify")
        bad = verify_store(self.store, report)
        for row in self:
            if not (self.store.root / "snapshots" / f"{row.snapshot}.json").is_file():
                report.find("rows", row.state_id, f"snapshot {row.snapshot} is not in the store")
                continue
            with contextlib.suppress(Exception):  # a broken manifest is reported above
                for e in self.store.get_snapshot(row.snapshot).entries:
                    if e.kind == "f" and e.digest in bad:
                        path = self.store.blob_path(e.digest)
                        report.find("rows", row.state_id, f"{e.path}: blob {path} is corrupted")
            if row.service is not None:
                self._verify_service(row, bad, report)
        report.count("rows", len(self))
        if bench is None:
            from bat_gym.catalog import get_benchmark

            bench = get_benchmark(self.info.benchmark)
        rows = list(self)
        if sample is not None and sample < len(rows):
            rows = random.Random(seed).sample(rows, sample)
        verify_replays(
            bench,
            rows,
            manifest=self.manifest,
            origin=str(self.root / "manifest.json"),
            bank_store=self.store,
            backend=backend,
            report=report,
        )
        verify_demonstrations(
            bench,
            rows,
            manifest=self.manifest,
            bank_store=self.store,
            backend=backend,
            report=report,
        )
        return report

    def _verify_service(self, row: StageState, bad: Any, report: BankReport) -> None:
        """Report a row whose service state (manifest or blobs) is missing or corrupted."""
        from bat_gym.core.service import load_service_snapshot

        assert row.service is not None
        try:
            snapshot = load_service_snapshot(self.store, row.service)
        except Exception as exc:  # noqa: BLE001 - every fault is a finding, never a crash
            report.find("rows", row.state_id, f"service state {row.service}: {type(exc).__name__}")
            return
        for name, digest in snapshot.blobs.items():
            if digest in bad or not self.store.blob_path(digest).is_file():
                report.find("rows", row.state_id, f"service blob {name} is missing or corrupted")

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
        write_atomic(root / "rows.jsonl", lines)
        write_atomic(
            root / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode()
        )
