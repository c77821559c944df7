"""The radiology suite's service: one private Orthanc, its state snapshot and restored exactly.

The state is every stored DICOM instance, byte for byte as uploaded, and the suite's
own records kept by Orthanc as series and study metadata (annotations on a series,
findings on a study). As blobs:

* ``dicom/<StudyInstanceUID>/<SeriesInstanceUID>/<SOPInstanceUID>.dcm``: an instance;
* ``meta/series/<SeriesInstanceUID>/annotations.json`` and
  ``meta/studies/<StudyInstanceUID>/findings.json``: the records, canonical JSON.

:meth:`OrthancService.restore` deletes what the target state lacks, uploads only the
instances it does not hold (the digest of what was uploaded is remembered, and the
server looked at again when its instances are not the ones remembered), and rewrites
the records that differ from the target's (the service remembers what it wrote, and
tools write records only through :meth:`OrthancService.add_record`); the server starts
on the first restore, and starts again (empty, then loaded) if it died.

Tools run in a child process per call (:mod:`bat_gym.core.tools`), so what a call writes is
never in this object's memory. :meth:`OrthancService.add_record` notes the record it is
about to write in a journal file beside the server's storage (before the write, so a
call killed mid-write is noted too); :meth:`OrthancService.after_tool_call` reads the
journal and reads just those records back from the server, so this object knows every
record again and the next restore rewrites (or deletes) only what differs. A journal
that cannot be read makes the next restore read every record again.

Size: a state is capped by :attr:`OrthancService.limits` (the core's
:class:`~bat_gym.core.service.ServiceLimits`: blobs and bytes) at every snapshot, and
:meth:`OrthancService.add_record` refuses, before writing, a record that would pass
them or :attr:`OrthancService.max_records` records on one series or study; the agent
sees a :class:`~bat_gym.core.service.ServiceStateTooLarge` naming the limit. The server
listens on 127.0.0.1 only, which no sandbox reaches (each runs without a network).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bat_gym.core.service import ServiceBlobs, ServiceLimits, ServiceState, ServiceStateTooLarge
from bat_gym.envs.radiology.orthanc import OrthancClient, OrthancError, OrthancServer

__all__ = ["ANNOTATIONS", "FINDINGS", "OrthancService", "canonical_json"]

ANNOTATIONS = "BatAnnotations"
"""The series metadata that holds the annotations stored on that series (a JSON list)."""
FINDINGS = "BatFindings"
"""The study metadata that holds the findings submitted for that study (a JSON list)."""

_JOURNAL = "records.journal"


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON bytes (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class _Server(OrthancServer):
    def _config(self, root: Any, port: int) -> dict[str, Any]:
        config = super()._config(root, port)
        config["UserMetadata"] = {ANNOTATIONS: 1024, FINDINGS: 1025}
        return config


class OrthancService(ServiceState):
    """A private Orthanc server as a benchmark service (started on first restore).

    Args:
        limits: the cap of one state (default: the core's :class:`ServiceLimits`).
        max_records: records (annotations, findings) one series or study may hold.
    """

    def __init__(self, limits: ServiceLimits | None = None, max_records: int = 64) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        if limits is not None:
            self.limits = limits
        self.max_records = max_records
        self.server: _Server | None = None
        # Set after a tool call: the records below may not be what the server holds.
        self._records_stale = False
        # blob name of each instance held -> (sha256 of what was uploaded, Orthanc id)
        self._held: dict[str, tuple[str, str]] = {}
        # (level, UID) -> the records the server holds there, as canonical JSON bytes
        self._records: dict[tuple[str, str], bytes] = {}
        # Orthanc ids are hashes of the DICOM UIDs, so a found id stays right.
        self._oids: dict[tuple[str, str], str] = {}

    @property
    def client(self) -> OrthancClient:
        """The REST client of the running server (started here if need be)."""
        if self.server is None:
            self.server = _Server().start()
        assert self.server.client is not None
        return self.server.client

    # -- records ------------------------------------------------------------------------

    def _orthanc_id(self, level: str, uid: str) -> str | None:
        if (level, uid) in self._oids:
            return self._oids[(level, uid)]
        tag = {"studies": "StudyInstanceUID", "series": "SeriesInstanceUID"}[level]
        kind = {"studies": "Study", "series": "Series"}[level]
        found = self.client.post("/tools/find", {"Level": kind, "Query": {tag: uid}})
        if not found:
            return None
        self._oids[(level, uid)] = str(found[0])
        return str(found[0])

    def read_records(self, level: str, uid: str) -> list[dict[str, Any]]:
        """The records (annotations of a series, findings of a study) stored on ``uid``."""
        oid = self._orthanc_id(level, uid)
        if oid is None:
            return []
        name = ANNOTATIONS if level == "series" else FINDINGS
        if name not in (self.client.get(f"/{level}/{oid}/metadata") or []):
            return []
        return list(json.loads(self.client.get(f"/{level}/{oid}/metadata/{name}", raw=True)))

    def add_record(self, level: str, uid: str, record: dict[str, Any]) -> int:
        """Append ``record`` to the records of ``uid``; return how many it now has.

        Raises:
            KeyError: no study or series has that UID.
            ServiceStateTooLarge: ``uid`` holds :attr:`max_records` already, or the
                state would pass :attr:`limits` (nothing is written).
        """
        oid = self._orthanc_id(level, uid)
        if oid is None:
            raise KeyError(uid)
        records = [*self.read_records(level, uid), record]
        kind = "series" if level == "series" else "study"
        if len(records) > self.max_records:
            raise ServiceStateTooLarge(
                "OrthancService.max_records",
                len(records),
                self.max_records,
                f"records on one {kind}",
                "the benchmark raises it with OrthancService(max_records=...)",
            )
        data = canonical_json(records)
        blobs, size = self.usage(without=(level, uid))
        self.limits.check(blobs + 1, size + len(data))
        name = ANNOTATIONS if level == "series" else FINDINGS
        self._note(level, uid)
        self.client.request("PUT", f"/{level}/{oid}/metadata/{name}", data)
        self._records[(level, uid)] = data
        return len(records)

    def usage(self, without: tuple[str, str] | None = None) -> tuple[int, int]:
        """``(blobs, bytes)`` of the state a snapshot would take now.

        Instances as the server counts them (``/statistics``), plus every record blob
        but ``without``'s (a (level, UID) about to be rewritten): as this object knows
        them, or read from the server when that knowledge is stale.
        """
        stats = self.client.get("/statistics")
        blobs, size = int(stats["CountInstances"]), int(stats["TotalDiskSize"])
        records = self._scan_records() if self._records_stale else self._records
        for key, data in records.items():
            if key != without:
                blobs, size = blobs + 1, size + len(data)
        return blobs, size

    def _journal(self) -> Path | None:
        if self.server is None or self.server.workdir is None:
            return None
        return Path(self.server.workdir) / _JOURNAL

    def _note(self, level: str, uid: str) -> None:
        """Note in the journal that the records of ``uid`` are about to change."""
        journal = self._journal()
        if journal is None:
            self._records_stale = True
            return
        with open(journal, "a", encoding="utf-8") as f:  # one short O_APPEND write
            f.write(json.dumps([level, uid]) + "\n")

    def after_tool_call(self) -> None:
        """A tool ran in a child process: read again the records it noted (module docs)."""
        journal = self._journal()
        try:
            if journal is None or not journal.exists():
                return
            lines = journal.read_text(encoding="utf-8").splitlines()
            journal.unlink()
            for key in {tuple(json.loads(line)) for line in lines}:
                level, uid = (str(k) for k in key)
                data = self._read_raw(level, uid)
                if data is None:
                    self._records.pop((level, uid), None)
                else:
                    self._records[(level, uid)] = data
        except (OSError, ValueError, TypeError, OrthancError):
            self._records_stale = True  # the next restore reads every record

    def _read_raw(self, level: str, uid: str) -> bytes | None:
        """The records blob the server holds on ``uid``, or None."""
        oid = self._orthanc_id(level, uid)
        name = ANNOTATIONS if level == "series" else FINDINGS
        if oid is None or name not in (self.client.get(f"/{level}/{oid}/metadata") or []):
            return None
        return bytes(self.client.get(f"/{level}/{oid}/metadata/{name}", raw=True))

    # -- ServiceState --------------------------------------------------------------------

    def snapshot(self) -> dict[str, bytes]:  # noqa: D102
        blobs: dict[str, bytes] = {}
        for iid in self.client.get("/instances"):
            tags = self.client.get(f"/instances/{iid}/simplified-tags")
            name = (
                f"dicom/{tags['StudyInstanceUID']}/{tags['SeriesInstanceUID']}/"
                f"{tags['SOPInstanceUID']}.dcm"
            )
            blobs[name] = self.client.get(f"/instances/{iid}/file", raw=True)
        for level, kind, tag in (
            ("series", "annotations", "SeriesInstanceUID"),
            ("studies", "findings", "StudyInstanceUID"),
        ):
            for oid in self.client.get(f"/{level}"):
                uid = self.client.get(f"/{level}/{oid}")["MainDicomTags"][tag]
                records = self.read_records(level, uid)
                if records:
                    blobs[f"meta/{level}/{uid}/{kind}.json"] = canonical_json(records)
        return blobs

    def restore(self, blobs: ServiceBlobs) -> None:  # noqa: D102
        if self.server is not None and not self.server.running:
            # It died (killed, out of memory): a new, empty one is loaded below.
            self.close()
        client = self.client
        self.after_tool_call()  # whatever the journal holds, in case a call went unheard
        wanted = {n: blobs.digest(n) for n in blobs if n.startswith("dicom/")}
        changed = self._records_stale
        if set(client.get("/instances")) != {oid for _, oid in self._held.values()}:
            self._held = self._scan()  # changed behind this object's back: look again
            changed = True
        for name, (digest, oid) in list(self._held.items()):
            if wanted.get(name) != digest:
                client.delete(f"/instances/{oid}")
                del self._held[name]
                changed = True
        for name, digest in wanted.items():
            if name not in self._held:
                self._held[name] = (digest, client.upload(blobs[name]))
                changed = True
        if changed:
            self._records = self._scan_records()
            self._records_stale = False
        # Records: every study and series gets exactly the target's (or none), and
        # only those that differ are written.
        target = {}
        for name in blobs:
            if name.startswith("meta/"):
                _, level, uid, _ = name.split("/", 3)
                target[(level, uid)] = blobs[name]
        for key in sorted(set(self._records) | set(target)):
            if self._records.get(key) == target.get(key):
                continue
            level, uid = key
            oid = self._orthanc_id(level, uid)
            if oid is None:
                continue
            meta = ANNOTATIONS if level == "series" else FINDINGS
            if key in target:
                client.request("PUT", f"/{level}/{oid}/metadata/{meta}", target[key])
            else:
                client.delete(f"/{level}/{oid}/metadata/{meta}")
        self._records = {k: v for k, v in target.items() if self._orthanc_id(*k) is not None}

    def _scan_records(self) -> dict[tuple[str, str], bytes]:
        """The records the server holds, looked up level by level."""
        records = {}
        for level, meta, tag in (
            ("series", ANNOTATIONS, "SeriesInstanceUID"),
            ("studies", FINDINGS, "StudyInstanceUID"),
        ):
            for oid in self.client.get(f"/{level}"):
                if meta in (self.client.get(f"/{level}/{oid}/metadata") or []):
                    uid = self.client.get(f"/{level}/{oid}")["MainDicomTags"][tag]
                    data = self.client.get(f"/{level}/{oid}/metadata/{meta}", raw=True)
                    records[(level, uid)] = data
        return records

    def _scan(self) -> dict[str, tuple[str, str]]:
        """What the server holds: blob name -> (sha256, Orthanc id) of each instance."""
        held = {}
        for iid in self.client.get("/instances"):
            tags = self.client.get(f"/instances/{iid}/simplified-tags")
            name = (
                f"dicom/{tags['StudyInstanceUID']}/{tags['SeriesInstanceUID']}/"
                f"{tags['SOPInstanceUID']}.dcm"
            )
            data = self.client.get(f"/instances/{iid}/file", raw=True)
            held[name] = (hashlib.sha256(data).hexdigest(), str(iid))
        return held

    def close(self) -> None:  # noqa: D102
        if self.server is not None:
            self.server.stop()
            self.server = None
        self._held, self._records, self._oids = {}, {}, {}
        self._records_stale = False
