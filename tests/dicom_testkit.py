"""Builders shared by the DICOM and preprocessing tests: tiny datasets, temporary manifests, pipelines.

Every dataset built here is synthetic. The only "patient" is the sentinel :data:`SECRET` (never a real
name), which tests search for in reprs and error messages.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from appliance.pipeline.loader import load_pipeline
from appliance.pipeline.preprocess import Pipeline

REPO = Path(__file__).resolve().parent.parent
CT_PIPELINE_TOML = REPO / "pipelines" / "ct-nodule.toml"
SECRET = "ZZSENTINEL^NOTAPATIENT"  # must never appear in a repr, log or error message

CT_PREPROCESS = {
    "window_center": -600.0,
    "window_width": 1500.0,
    "resize": "area",
    "normalize": "window_unit",
    "photometric": "MONOCHROME2",
    "jpeg2000_lowpass": True,  # as models/ct-nodule: validated on half-resolution JPEG 2000 input
}


def write_manifest(
    models_dir: Path,
    name: str = "ct-nodule",
    shape: tuple[int, ...] = (8, 1, 256, 256),
    preprocess: dict[str, Any] | None = None,
) -> Path:
    """Write a minimal valid ``models/<name>/model.toml`` (the artifact file need not exist)."""
    pre = CT_PREPROCESS if preprocess is None else preprocess
    pre_lines = "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}".replace("'", '"')
                          for k, v in pre.items())
    b = shape[0]
    text = f"""format_version = 1
name = "{name}"
version = "0.0.1"
description = "test manifest"
default_precision = "fp32"

[input]
name = "image"
shape = {list(shape)}
dtype = "float32"

[input.preprocess]
{pre_lines}

[[outputs]]
name = "prob"
shape = [{b}, 1]

[artifacts.fp32]
file = "{name}.fp32.onnx"
precision = "fp32"
sha256 = "{"0" * 64}"
bytes = 1
"""
    path = models_dir / name / "model.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def ct_pipeline(tmp_path: Path, shape: tuple[int, ...] = (8, 1, 256, 256)) -> Pipeline:
    """Load the repository's ``pipelines/ct-nodule.toml`` against a temporary ct-nodule manifest."""
    models = tmp_path / "models"
    if not (models / "ct-nodule" / "model.toml").exists():
        write_manifest(models, shape=shape)
    return load_pipeline(CT_PIPELINE_TOML, models)


ANY_GREY_TOML = """format_version = 1
name = "any-grey"
model = "any-grey"
description = "test pipeline: any image, colour to luma, the file's window (fallback 2048/4096)"

[accept]
colour = "luminance"

[[steps]]
name = "modality_lut"

[[steps]]
name = "window"
center = 2048.0
width = 4096.0
source = "file"

[[steps]]
name = "invert_monochrome1"

[[steps]]
name = "resize"

[[steps]]
name = "normalize"
kind = "none"
"""


def any_grey_pipeline(tmp_path: Path, shape: tuple[int, ...] = (2, 1, 64, 64)) -> Pipeline:
    """A permissive pipeline (no contract) that lets every image through, to exercise decoding."""
    models = tmp_path / "models"
    write_manifest(models, name="any-grey", shape=shape, preprocess={})
    path = tmp_path / "any-grey.toml"
    path.write_text(ANY_GREY_TOML, encoding="utf-8")
    return load_pipeline(path, models)


def write_pipeline(tmp_path: Path, text: str, name: str = "p") -> Path:
    """Write a pipeline TOML into ``tmp_path`` and return its path."""
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def make_dataset(
    pixels: np.ndarray | None = None,
    *,
    rows: int = 4,
    columns: int = 4,
    frames: int | None = None,
    photometric: str = "MONOCHROME2",
    modality: str = "CT",
    sop_class: str = CTImageStorage,
    bits_stored: int = 12,
    **tags: Any,
) -> Dataset:
    """Return a small native image dataset (uint16 unless ``pixels`` says otherwise) with file meta."""
    if pixels is None:
        shape = (frames, rows, columns) if frames else (rows, columns)
        pixels = (np.arange(np.prod(shape), dtype=np.uint16) % (1 << bits_stored)).reshape(shape)
    ds = Dataset()
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = generate_uid()
    ds.Modality = modality
    ds.PatientName = SECRET
    ds.PatientID = "ZZSENTINEL-ID"
    ds.Rows, ds.Columns = pixels.shape[-2], pixels.shape[-1]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = pixels.dtype.itemsize * 8
    ds.BitsStored = bits_stored
    ds.HighBit = bits_stored - 1
    ds.PixelRepresentation = 1 if pixels.dtype.kind == "i" else 0
    if frames:
        ds.NumberOfFrames = frames
    ds.PixelData = np.ascontiguousarray(pixels).tobytes()
    ds["PixelData"].VR = "OW" if pixels.dtype.itemsize > 1 else "OB"
    for key, value in tags.items():
        setattr(ds, key, value)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta = meta
    return ds


def to_bytes(ds: Dataset, *, enforce: bool = True) -> bytes:
    """Serialise ``ds`` as a Part 10 file; ``enforce=False`` lets broken datasets through."""
    buf = io.BytesIO()
    if not enforce:
        ds.preamble = b"\x00" * 128  # still a Part 10 file, just with a file meta pydicom would refuse
    ds.save_as(buf, enforce_file_format=enforce)
    return buf.getvalue()
