"""Tests for the synthetic CT generator: determinism, realism of tags, round trips through every syntax."""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
from pydicom.uid import JPEG2000Lossless, JPEGLSNearLossless, RLELossless

from appliance.pipeline.kernels import resize_area, window_to_unit
from appliance.tools import synthetic as S


@pytest.fixture(scope="module")
def positive() -> S.SliceTruth:
    return S.generate_slice(1234, nodule=True, size=512)


def test_deterministic_per_seed() -> None:
    a, b = S.generate_slice(7), S.generate_slice(7)
    assert np.array_equal(a.hu, b.hu)
    assert a.nodules == b.nodules and a.pixel_spacing_mm == b.pixel_spacing_mm
    assert not np.array_equal(a.hu, S.generate_slice(8).hu)
    assert S.to_dicom(a) == S.to_dicom(b)


def test_repr_has_no_arrays(positive: S.SliceTruth) -> None:
    r = repr(positive)
    assert "SliceTruth(" in r and "array" not in r and len(r) < 200


def test_truth_is_consistent(positive: S.SliceTruth) -> None:
    assert positive.has_nodule and positive.nodules
    assert positive.hu.dtype == np.float32 and positive.hu.shape == (512, 512)
    fov = positive.pixel_spacing_mm[1] * 512
    assert 300.0 <= fov <= 450.0
    for r, c, d, _hu in positive.nodules:
        assert 0 <= r < 512 and 0 <= c < 512 and d >= S.NODULE_MIN_DIAMETER_MM
        # the nodule is visibly denser than aerated lung at its centre
        assert positive.hu[int(r), int(c)] > -700.0
    neg = S.generate_slice(1235, nodule=False)
    assert not neg.has_nodule and neg.nodules == []


def test_anatomy_in_hu(positive: S.SliceTruth) -> None:
    hu = positive.hu
    assert hu[:8, :8].mean() == pytest.approx(-1000.0, abs=40.0)  # air in the corner
    lung = hu[(hu > -950) & (hu < -750)]
    assert lung.size > 5000  # there are lungs at about -850 HU
    assert (hu > 300).sum() > 500  # bone


def test_prevalence_and_sizes() -> None:
    slices = [S.generate_slice(s, size=256) for s in range(40)]
    pos = [s for s in slices if s.has_nodule]
    assert 10 <= len(pos) <= 30
    assert all(4.0 <= d <= 30.0 for s in pos for _, _, d, _ in s.nodules)


@pytest.mark.parametrize("ts", sorted(S.TRANSFER_SYNTAXES), ids=lambda u: pydicom.uid.UID(u).name)
def test_transfer_syntax_round_trip(positive: S.SliceTruth, ts: str) -> None:
    data = S.to_dicom(positive, transfer_syntax=ts)
    ds = pydicom.dcmread(io.BytesIO(data))
    assert ds.file_meta.TransferSyntaxUID == ts
    assert ds.SOPClassUID == pydicom.uid.CTImageStorage and ds.Modality == "CT"
    assert str(ds.PatientName) == "PHANTOM^0001" and ds.PatientID == "PHANTOM-0001"
    assert float(ds.RescaleIntercept) == -1024.0 and float(ds.RescaleSlope) == 1.0
    assert ds.PhotometricInterpretation == "MONOCHROME2" and ds.BitsStored == 12
    assert [float(v) for v in ds.WindowCenter] == [-600.0, 40.0]
    assert float(ds.PixelSpacing[0]) == pytest.approx(positive.pixel_spacing_mm[0], abs=1e-5)
    back = S.read_back(data)
    err = np.abs(back - S.modality_values(positive)).max()
    assert err <= (2.0 if ts == JPEGLSNearLossless else 0.0)


def test_signed_storage(positive: S.SliceTruth) -> None:
    ds = pydicom.dcmread(io.BytesIO(S.to_dicom(positive, signed=True)))
    assert ds.PixelRepresentation == 1 and ds.BitsStored == 16
    assert np.array_equal(S.read_back(S.to_dicom(positive, signed=True)), S.modality_values(positive))


def test_series_is_coherent() -> None:
    series = S.generate_series(5, 4, slice_thickness_mm=2.5, n_nodules=1, size=256)
    dss = [pydicom.dcmread(io.BytesIO(S.to_dicom(s))) for s in series]
    assert len({d.StudyInstanceUID for d in dss}) == 1 and len({d.SeriesInstanceUID for d in dss}) == 1
    assert len({d.SOPInstanceUID for d in dss}) == 4
    z = [float(d.ImagePositionPatient[2]) for d in dss]
    assert np.allclose(np.diff(z), 2.5)
    assert [d.InstanceNumber for d in dss] == [1, 2, 3, 4]


def test_model_input_matches_the_pipeline_kernels(positive: S.SliceTruth) -> None:
    params = {"window_center": -600.0, "window_width": 1500.0, "size": (256, 256)}
    x = S.model_input(positive, params)
    assert x.shape == (1, 256, 256) and x.dtype == np.float32
    hu = S.read_back(S.to_dicom(positive, transfer_syntax=RLELossless))
    expected = resize_area(window_to_unit(hu, -600.0, 1500.0), (256, 256))
    assert np.array_equal(x[0], expected)


@pytest.mark.parametrize("size", [384, 640])
def test_model_input_other_sizes(size: int) -> None:
    s = S.generate_slice(3, size=size)
    x = S.model_input(s, {"window_center": -600.0, "window_width": 1500.0, "size": (256, 256)})
    assert x.shape == (1, 256, 256) and 0.0 <= x.min() and x.max() <= 1.0


def test_workloads() -> None:
    files = S.workload("mixed", 24, seed=3)
    assert len(files) == 24
    assert files == S.workload("mixed", 24, seed=3)
    dss = [pydicom.dcmread(io.BytesIO(f)) for f in files]
    assert len({d.SOPInstanceUID for d in dss}) == 24
    assert len({d.file_meta.TransferSyntaxUID for d in dss}) >= 3
    j2k = S.workload("j2k", 2, seed=3)
    assert all(pydicom.dcmread(io.BytesIO(f)).file_meta.TransferSyntaxUID == JPEG2000Lossless for f in j2k)
    with pytest.raises(KeyError):
        S.workload("nope", 1, 0)
