"""A frame is one codestream: data after its end, and fragments after the last frame, are refused (docs/dicom.md).

Review 17: JPEG baseline, JPEG-LS and JPEG 2000 pixel data without an offset table that held more complete
codestreams than Number of Frames (two back to back in one frame, or three fragments for two frames) were answered
OK, the extra image never decoded: the frame ended with FF D9, and nothing looked past the first codestream's end.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.encaps import encapsulate, encapsulate_extended
from pydicom.uid import JPEG2000Lossless, JPEGBaseline8Bit, JPEGLSLossless

from appliance.dicom import parse
from appliance.errors import DicomError
from tests.dicom_testkit import make_dataset, to_bytes

KINDS = ["jpeg", "jpeg-ls", "j2k"]
AFTER_END = r"frame \d \(.*\): the frame holds \d+ bytes after its codestream's end marker \(FFD9\).*\(0028,0008\)"
PAST_LAST = r"\(0028,0008\) Number of Frames = 2 but \(7FE0,0010\) Pixel Data holds more: 1 fragment"


def _stream(kind: str, seed: int) -> bytes:
    """One complete 32 x 32 codestream of ``kind`` (8-bit for JPEG baseline, 12-bit otherwise)."""
    rng = np.random.default_rng(seed)
    if kind == "jpeg":
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32)).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        return buf.getvalue()
    ds = make_dataset(pixels=rng.integers(0, 4096, (32, 32)).astype(np.uint16))
    if kind == "jpeg-ls":
        ds.compress(JPEGLSLossless, encoding_plugin="pyjpegls")
    else:
        ds.compress(JPEG2000Lossless, encoding_plugin="pylibjpeg")
    return next(pydicom.encaps.generate_frames(ds.PixelData, number_of_frames=1))


def _even(data: bytes) -> bytes:
    return data + b"\x00" * (len(data) % 2)


def _file(kind: str, fragments: list[bytes], frames: int, *, extended: bool = False) -> bytes:
    ds = make_dataset(rows=32, columns=32, bits_stored=8 if kind == "jpeg" else 12)
    if kind == "jpeg":
        ds.BitsAllocated = 8
    if frames > 1:
        ds.NumberOfFrames = frames
    syntaxes = {"jpeg": JPEGBaseline8Bit, "jpeg-ls": JPEGLSLossless, "j2k": JPEG2000Lossless}
    ds.file_meta.TransferSyntaxUID = syntaxes[kind]
    if extended:  # an Extended Offset Table for the first ``frames`` fragments, the rest appended as items
        pixels, ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths = encapsulate_extended(fragments[:frames])
        ds.PixelData = pixels + b"".join(struct.pack("<HHI", 0xFFFE, 0xE000, len(f)) + f
                                         for f in map(_even, fragments[frames:]))
    else:
        ds.PixelData = encapsulate([_even(f) for f in fragments], has_bot=False)
    ds["PixelData"].is_undefined_length = True
    return to_bytes(ds)


def _decode_all(data: bytes) -> None:
    inst = parse(data)
    for i in range(inst.number_of_frames):
        inst.decode_frame(i)


@pytest.mark.parametrize("kind", KINDS)
def test_honest_frames_with_pad_bytes_decode(kind):
    a, b = _stream(kind, 1), _stream(kind, 2)
    _decode_all(_file(kind, [a], 1))
    _decode_all(_file(kind, [a + b"\x00\xff\x00"], 1))
    _decode_all(_file(kind, [a, b], 2))
    half = len(a) // 4 * 2
    _decode_all(_file(kind, [a[:half], a[half:]], 1))  # one codestream over two (even) fragments


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["one fragment", "two fragments", "padded"])
def test_two_codestreams_in_one_frame_are_refused(kind, layout):
    a, b = _stream(kind, 1), _stream(kind, 2)
    fragments = {"one fragment": [a + b], "two fragments": [a, b], "padded": [_even(a) + b"\x00\x00" + b]}[layout]
    with pytest.raises(DicomError, match=AFTER_END):
        _decode_all(_file(kind, fragments, 1))


@pytest.mark.parametrize("kind", KINDS)
def test_more_codestreams_than_frames_without_an_offset_table_are_refused(kind):
    a, b, c = (_stream(kind, seed) for seed in (1, 2, 3))
    with pytest.raises(DicomError, match=PAST_LAST + r".* follow the end marker \(FFD9\) of the last frame"):
        parse(_file(kind, [a, b, c], 2))
    with pytest.raises(DicomError, match=r"frame 1 .*" + AFTER_END[8:]):
        _decode_all(_file(kind, [a, _even(b) + c], 2))


def test_a_fragment_outside_the_extended_offset_table_is_refused():
    a, b, c = (_stream("jpeg-ls", seed) for seed in (1, 2, 3))
    _decode_all(_file("jpeg-ls", [a, b], 2, extended=True))
    with pytest.raises(DicomError, match=PAST_LAST[:-10] + r".*\(7FE0,0001\) Extended Offset Table reads one fragment "
                                         "per frame, but there are 3"):
        parse(_file("jpeg-ls", [a, b, c], 2, extended=True))


def test_an_end_marker_inside_a_marker_segment_does_not_end_the_jpeg_codestream():
    """An APPn segment can hold a whole thumbnail JPEG; its FF D9 is skipped with the segment."""
    a = _stream("jpeg", 1)
    thumbnail = _stream("jpeg", 2)
    app = b"\xff\xe1" + struct.pack(">H", 2 + len(thumbnail)) + thumbnail
    frame = a[:2] + app + a[2:]
    _decode_all(_file("jpeg", [frame], 1))
    with pytest.raises(DicomError, match=AFTER_END):
        _decode_all(_file("jpeg", [frame + thumbnail], 1))


def test_a_j2k_last_tile_part_of_unknown_length_followed_by_a_second_codestream_is_refused():
    """Psot = 0: the tile-part runs to the end, so the walk cannot reach EOC; EOC + SOC + SIZ still ends it."""
    a, b = bytearray(_stream("j2k", 1)), _stream("j2k", 2)
    sot = a.index(b"\xff\x90")
    a[sot + 6 : sot + 10] = bytes(4)  # Psot = 0
    _decode_all(_file("j2k", [bytes(a)], 1))
    with pytest.raises(DicomError, match=AFTER_END):
        _decode_all(_file("j2k", [bytes(a) + b], 1))
