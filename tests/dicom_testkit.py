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


#: Code length of each lossless JPEG difference category 0..16 (a valid prefix code: Kraft sum < 1).
_LJPEG_CODE_LENGTHS = (2, 3, 3, 3, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)


def encode_lossless_jpeg(
    samples: np.ndarray, *, precision: int, predictor: int = 1, restart_rows: int = 0, point_transform: int = 0
) -> bytes:
    """Encode one grey frame as Huffman-coded lossless JPEG (SOF3), as ITU-T T.81 Annex H lays it out.

    pydicom writes no lossless JPEG, so the tests make their own; each test that uses it also decodes the result
    with the real decoder (pylibjpeg) and compares, so a mistake here fails loudly. ``samples`` are unsigned
    ``precision``-bit values; with a point transform their low bits are dropped.
    """
    v = samples.astype(np.int64) >> point_transform
    rows, columns = v.shape
    codes, huffval, code, length = {}, [], 0, 1  # canonical codes, shortest first (T.81 C.2)
    for category in sorted(range(17), key=lambda c: (_LJPEG_CODE_LENGTHS[c], c)):
        while length < _LJPEG_CODE_LENGTHS[category]:
            code, length = code << 1, length + 1
        codes[category] = (code, length)
        huffval.append(category)
        code += 1
    intervals = []
    step = restart_rows or rows
    for top in range(0, rows, step):
        out = []
        for r in range(top, min(top + step, rows)):
            for c in range(columns):
                if r == top:
                    pred = (1 << (precision - point_transform - 1)) if c == 0 else v[r, c - 1]
                elif c == 0:
                    pred = v[r - 1, 0]
                else:
                    ra, rb, rc = v[r, c - 1], v[r - 1, c], v[r - 1, c - 1]
                    pred = (ra, rb, rc, ra + rb - rc, ra + ((rb - rc) >> 1), rb + ((ra - rc) >> 1),
                            (ra + rb) >> 1)[predictor - 1]
                diff = int(v[r, c] - pred) & 0xFFFF
                diff = diff - 0x10000 if diff >= 0x8000 else diff
                category = abs(diff).bit_length()
                code, length = codes[category]
                out.append(format(code, f"0{length}b"))
                if 0 < category < 16:
                    out.append(format(diff if diff > 0 else diff - 1 + (1 << category), f"0{category}b"))
        bits = "".join(out)
        bits += "1" * (-len(bits) % 8)  # pad the interval to a byte with 1-bits
        data = bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8))
        intervals.append(data.replace(b"\xff", b"\xff\x00"))
    counts = bytes(sum(1 for c in range(17) if _LJPEG_CODE_LENGTHS[c] == n) for n in range(1, 17))

    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body

    head = b"\xff\xd8" + segment(0xC3, bytes([precision]) + rows.to_bytes(2, "big") + columns.to_bytes(2, "big")
                                 + b"\x01\x01\x11\x00")
    head += segment(0xC4, b"\x00" + counts + bytes(huffval))
    if restart_rows:
        head += segment(0xDD, (restart_rows * columns).to_bytes(2, "big"))
    head += segment(0xDA, bytes([1, 1, 0x00, predictor, 0, point_transform]))
    body = b"".join(data + (bytes([0xFF, 0xD0 + i % 8]) if i < len(intervals) - 1 else b"")
                    for i, data in enumerate(intervals))
    return head + body + b"\xff\xd9"
