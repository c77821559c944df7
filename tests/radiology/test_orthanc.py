"""The Orthanc manager and the service: a private server, exact snapshot and restore."""

from __future__ import annotations

import json

import pytest

from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.service import capture_service, put_service_blobs, restore_service
from bat_gym.envs.radiology.orthanc import INSTALL, OrthancMissing, OrthancServer, find_orthanc
from bat_gym.envs.radiology.service import OrthancService
from bat_gym.envs.radiology.studies import make_patient, render_patient


def test_a_missing_binary_names_the_install_command(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(OrthancMissing, match=r"apt-get update && apt-get install -y orthanc"):
        find_orthanc()
    assert INSTALL == "apt-get update && apt-get install -y orthanc"


def test_two_servers_are_private_and_stop_clean(orthanc):
    a, b = OrthancServer(), OrthancServer()
    with a, b:
        assert a.port != b.port and a.url.startswith("http://127.0.0.1:")
        files = render_patient(make_patient(1, "dx_chest", prior=False), 1)
        a.client.upload(next(iter(files.values())))
        assert len(a.client.get("/instances")) == 1 and b.client.get("/instances") == []
        workdir = a.workdir
    assert not a.running and not workdir.exists()


def test_the_service_restores_exactly_and_incrementally(orthanc, tmp_path):
    store = BlobStore(tmp_path / "store")
    ct = render_patient(make_patient(1, "ct_chest", prior=True), 1)
    mr = render_patient(make_patient(2, "mr_brain", prior=False), 2)
    one, both = put_service_blobs(store, ct), put_service_blobs(store, {**ct, **mr})
    service = OrthancService()
    try:
        restore_service(service, store, one)
        assert capture_service(service, store) == one
        study = next(iter(ct)).split("/")[1]
        service.add_record("studies", study, {"lesion_diameter_mm": 12.5})
        noted = capture_service(service, store)
        assert noted != one
        restore_service(service, store, both)
        assert capture_service(service, store) == both
        assert service.read_records("studies", study) == []
        restore_service(service, store, noted)
        assert capture_service(service, store) == noted
        assert service.read_records("studies", study) == [{"lesion_diameter_mm": 12.5}]
        blob = json.loads(service.snapshot()[f"meta/studies/{study}/findings.json"])
        assert blob == [{"lesion_diameter_mm": 12.5}]
    finally:
        service.close()
    assert service.server is None
