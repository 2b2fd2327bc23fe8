"""Synthetic slices as DICOM Part 10 bytes in any accepted transfer syntax, and named benchmark workloads."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    UID,
    CTImageStorage,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)

from appliance.tools.synthetic.series import (
    RESCALE_INTERCEPT,
    UID_ROOT,
    SeriesInfo,
    SliceTruth,
    generate_slice,
    phantom_uid,
    stored_values,
)

__all__ = ["TRANSFER_SYNTAXES", "WORKLOADS", "read_back", "to_dicom", "workload"]

# Transfer syntax UID -> pixel encoding plugin for ds.compress ("" = native, written by pydicom itself).
TRANSFER_SYNTAXES: dict[str, str] = {
    ExplicitVRLittleEndian: "",
    ImplicitVRLittleEndian: "",
    DeflatedExplicitVRLittleEndian: "",
    ExplicitVRBigEndian: "",
    RLELossless: "pylibjpeg",
    JPEGLSLossless: "pyjpegls",
    JPEGLSNearLossless: "pyjpegls",
    JPEG2000Lossless: "pylibjpeg",
}

# Named workload mixes for ``appliance bench``: transfer syntax UID -> relative weight.
WORKLOADS: dict[str, dict[str, float]] = {
    # What a PACS typically sends a CT box: mostly uncompressed, then lossless compressions.
    "mixed": {
        ExplicitVRLittleEndian: 0.40,
        ImplicitVRLittleEndian: 0.10,
        RLELossless: 0.15,
        JPEGLSLossless: 0.15,
        JPEG2000Lossless: 0.15,
        DeflatedExplicitVRLittleEndian: 0.05,
    },
    "native": {ExplicitVRLittleEndian: 0.8, ImplicitVRLittleEndian: 0.2},
    "j2k": {JPEG2000Lossless: 1.0},
    "jpegls": {JPEGLSLossless: 0.7, JPEGLSNearLossless: 0.3},
    "rle": {RLELossless: 1.0},
    # The held-out peer-comparison mix (docs/performance.md): a quarter each of uncompressed, RLE, JPEG-LS and
    # JPEG 2000, all lossless.
    "quarters": {ExplicitVRLittleEndian: 0.25, RLELossless: 0.25, JPEGLSLossless: 0.25, JPEG2000Lossless: 0.25},
}

def _base_dataset(
    truth: SliceTruth, patient_index: int, series: SeriesInfo | None, instance_number: int | None, signed: bool
) -> Dataset:
    series = series or truth.series
    seed = truth.seed
    study_uid = series.study_uid if series else phantom_uid(seed, "study")
    series_uid = series.series_uid if series else phantom_uid(seed, "series", 1)
    for_uid = series.frame_of_reference_uid if series else phantom_uid(seed, "for")
    number = instance_number if instance_number is not None else truth.instance_number
    rows, cols = truth.shape
    ds = Dataset()
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = phantom_uid(seed, "instance", number, series_uid)
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.FrameOfReferenceUID = for_uid
    ds.Modality = "CT"
    ds.Manufacturer = "edge-appliance synthetic"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.PatientName = f"PHANTOM^{patient_index:04d}"
    ds.PatientID = f"PHANTOM-{patient_index:04d}"
    ds.PatientBirthDate = ""
    ds.PatientSex = "O"
    ds.StudyDate = "20240101"
    ds.StudyTime = "120000"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.StudyID = "1"
    ds.SeriesNumber = series.series_number if series else 1
    ds.InstanceNumber = number
    ds.BodyPartExamined = "CHEST"
    ds.KVP = "120"
    ds.SliceThickness = f"{(series.slice_thickness_mm if series else truth.slice_thickness_mm):.2f}"
    ds.PixelSpacing = [f"{truth.pixel_spacing_mm[0]:.6f}", f"{truth.pixel_spacing_mm[1]:.6f}"]
    x0 = -(cols / 2.0 - 0.5) * truth.pixel_spacing_mm[1]
    y0 = -(rows / 2.0 - 0.5) * truth.pixel_spacing_mm[0]
    ds.ImagePositionPatient = [f"{x0:.4f}", f"{y0:.4f}", f"{truth.z_mm:.4f}"]
    ds.ImageOrientationPatient = ["1", "0", "0", "0", "1", "0"]
    ds.SliceLocation = f"{truth.z_mm:.4f}"
    ds.PatientPosition = "HFS"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = rows, cols
    ds.BitsAllocated = 16
    ds.BitsStored = 16 if signed else 12
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 1 if signed else 0
    ds.RescaleIntercept = str(int(RESCALE_INTERCEPT))
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.WindowCenter = ["-600", "40"]
    ds.WindowWidth = ["1500", "400"]
    ds.WindowCenterWidthExplanation = ["LUNG", "MEDIASTINUM"]
    ds.PixelData = stored_values(truth, signed=signed).tobytes()
    ds["PixelData"].VR = "OW"
    return ds


def _encode(ds: Dataset, transfer_syntax: str) -> Dataset:
    """Set the file meta and compress in place for ``transfer_syntax``; returns ``ds``."""
    if transfer_syntax not in TRANSFER_SYNTAXES:
        raise ValueError(f"unsupported transfer syntax {transfer_syntax}; have {sorted(TRANSFER_SYNTAXES)}")
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.ImplementationClassUID = UID(UID_ROOT + "1")
    meta.ImplementationVersionName = "EDGEAPPL_SYN"
    ds.file_meta = meta
    plugin = TRANSFER_SYNTAXES[transfer_syntax]
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    if plugin:
        kwargs: dict[str, Any] = {"encoding_plugin": plugin}
        if transfer_syntax == JPEGLSNearLossless:
            kwargs["jls_error"] = 2
        ds.compress(transfer_syntax, **kwargs)
    else:
        if transfer_syntax == ExplicitVRBigEndian:
            arr = np.frombuffer(ds.PixelData, dtype=np.int16 if ds.PixelRepresentation else np.uint16)
            ds.PixelData = arr.byteswap().tobytes()
        meta.TransferSyntaxUID = UID(transfer_syntax)
    return ds


def _write(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def to_dicom(
    truth: SliceTruth,
    *,
    transfer_syntax: str = ExplicitVRLittleEndian,
    patient_index: int = 1,
    series: SeriesInfo | None = None,
    instance_number: int | None = None,
    signed: bool = False,
) -> bytes:
    """Return ``truth`` as a Part-10 CT Image Storage file (bytes).

    The file carries RescaleIntercept -1024 / slope 1, lung and mediastinal window presets, pixel spacing,
    slice thickness, position/orientation, a phantom patient and deterministic UIDs derived from the seed.

    Args:
        truth: the slice.
        transfer_syntax: one of :data:`TRANSFER_SYNTAXES` (native, deflated, big endian, RLE, JPEG-LS
            lossless/near-lossless (NEAR=2), JPEG 2000 lossless).
        patient_index: phantom number: ``PHANTOM^0001``, ``PHANTOM-0001``.
        series: series identity (default: the slice's own, or one derived from its seed).
        instance_number: InstanceNumber (default: the slice's).
        signed: store int16 with BitsStored 16 (PixelRepresentation 1) instead of uint16 with BitsStored 12.
    """
    ds = _base_dataset(truth, patient_index, series, instance_number, signed)
    return _write(_encode(ds, transfer_syntax))


def _apportion(weights: np.ndarray, n: int) -> np.ndarray:
    """Syntax index per file: exactly round(n * share) files of each (largest remainder), in index order."""
    quota = weights / weights.sum() * n
    counts = np.floor(quota).astype(int)
    for k in np.argsort(-(quota - counts), kind="stable")[: n - int(counts.sum())]:
        counts[k] += 1
    return np.repeat(np.arange(len(weights)), counts)


def workload(name: str, n: int, seed: int) -> list[bytes]:
    """Return ``n`` DICOM files (bytes) in the named transfer-syntax mix of :data:`WORKLOADS`.

    The mix is exact (largest-remainder counts, shuffled by the seed), so two runs of a benchmark never differ
    by a sampled composition. A handful of base slices is generated and each (slice, syntax) pair is encoded
    once; every returned file still has its own SOPInstanceUID and InstanceNumber.

    Args:
        name: a key of :data:`WORKLOADS`.
        n: number of files.
        seed: the seed; the result is a pure function of (name, n, seed).
    """
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; have {sorted(WORKLOADS)}")
    mix = WORKLOADS[name]
    rng = np.random.default_rng([seed, 17])
    syntaxes = list(mix)
    weights = np.asarray([mix[s] for s in syntaxes], dtype=np.float64)
    chosen = rng.permutation(_apportion(weights, n))
    n_base = min(n, 8)
    bases = [generate_slice(int(np.random.default_rng([seed, 19, i]).integers(2**31 - 1)), size=512) for i in
             range(n_base)]
    cache: dict[tuple[int, str], Dataset] = {}
    out = []
    for i in range(n):
        b, ts = i % n_base, syntaxes[int(chosen[i])]
        if (b, ts) not in cache:
            ds = _base_dataset(bases[b], 1 + b, None, 1, signed=False)
            cache[(b, ts)] = _encode(ds, ts)
        ds = cache[(b, ts)]
        ds.InstanceNumber = i + 1
        ds.SOPInstanceUID = phantom_uid(seed, name, "instance", i)
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        out.append(_write(ds))
    return out


def read_back(data: bytes) -> np.ndarray:
    """Decode a generated file's pixels to modality values (float32 HU). Test helper, not the serving path."""
    ds = pydicom.dcmread(io.BytesIO(data))
    arr = ds.pixel_array.astype(np.float32)
    return arr * np.float32(float(ds.RescaleSlope)) + np.float32(float(ds.RescaleIntercept))
