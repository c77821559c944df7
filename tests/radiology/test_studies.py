"""Synthetic studies: deterministic bytes, realistic headers, priors and the mislabelled case."""

from __future__ import annotations

import io

import pydicom
import pytest

from bat_gym.envs.radiology.studies import IMPLEMENTATION_UID, make_patient, render_patient


def _read(files):
    return [pydicom.dcmread(io.BytesIO(b)) for b in files.values()]


def test_the_same_seed_gives_the_same_bytes():
    a = render_patient(make_patient(11, "ct_chest", prior=True), 11)
    b = render_patient(make_patient(11, "ct_chest", prior=True), 11)
    assert a == b and a != render_patient(make_patient(12, "ct_chest", prior=True), 12)


def test_ct_headers_carry_geometry_and_the_rescale():
    dss = _read(render_patient(make_patient(3, "ct_chest", prior=False), 3))
    ds = dss[0]
    assert ds.Modality == "CT" and ds.file_meta.ImplementationClassUID == IMPLEMENTATION_UID
    assert [float(v) for v in ds.ImageOrientationPatient] == [1, 0, 0, 0, 1, 0]
    assert float(ds.RescaleIntercept) == -1024 and ds.RescaleType == "HU"
    assert len(ds.PixelSpacing) == 2 and float(ds.SliceThickness) == 2.5
    assert sorted(int(d.InstanceNumber) for d in dss) == list(range(1, len(dss) + 1))
    zs = sorted(float(d.ImagePositionPatient[2]) for d in dss)
    assert all(b - a == pytest.approx(2.5) for a, b in zip(zs, zs[1:], strict=False))


def test_a_prior_is_the_same_patient_earlier_with_a_smaller_lesion():
    patient = make_patient(5, "mr_brain", prior=True)
    prior, current = patient.studies
    assert prior.date < current.date and prior.uid != current.uid
    assert prior.lesion.diameter_mm < current.lesion.diameter_mm
    dss = _read(render_patient(patient, 5))
    assert {d.PatientID for d in dss} == {patient.patient_id}
    assert (
        len({d.StudyInstanceUID for d in dss}) == 2 and len({d.SeriesInstanceUID for d in dss}) == 4
    )


def test_a_mislabelled_study_swaps_descriptions_but_not_parameters():
    patient = make_patient(9, "mr_brain", prior=False, mislabelled=True)
    dss = _read(render_patient(patient, 9))
    by_desc = {d.SeriesDescription: float(d.EchoTime) for d in dss}
    assert by_desc == {"T1 AX": 95.0, "T2 AX": 12.0}


def test_a_radiograph_gives_the_detector_spacing_and_an_inverted_one_is_monochrome1():
    plain = make_patient(21, "dx_chest", prior=True)
    dark = make_patient(21, "dx_chest", prior=True, inverted=True)
    ds_plain, ds_dark = (
        next(d for d in _read(render_patient(p, 21)) if d.StudyDate == p.studies[-1].date)
        for p in (plain, dark)
    )
    magnification = plain.studies[-1].magnification
    assert 1.08 <= magnification <= 1.25 and "PixelSpacing" not in ds_plain
    assert float(ds_plain.EstimatedRadiographicMagnificationFactor) == pytest.approx(magnification)
    assert float(ds_plain.ImagerPixelSpacing[0]) == pytest.approx(4.0 * magnification, abs=1e-4)
    assert (ds_plain.PhotometricInterpretation, ds_dark.PhotometricInterpretation) == (
        "MONOCHROME2",
        "MONOCHROME1",
    )
    assert (ds_dark.pixel_array.astype(int) + ds_plain.pixel_array == 4095).all()
    # Only the current study is inverted; the prior stays MONOCHROME2.
    assert {d.PhotometricInterpretation for d in _read(render_patient(dark, 21))} == {
        "MONOCHROME1",
        "MONOCHROME2",
    }
