"""16-bit RLE frames whose byte segments are in the wrong order are refused, not decoded to byte-swapped values;
frames whose segments do not hold Rows x Columns bytes are refused naming the segment and the sizes.

Held-out review, session 14: pydicom masks RLE samples to Bits Stored, so a 12-bit CT slice with its low-byte segment
first decoded to in-range noise and was scored (0.71 for 0.9989). Session 17's review: a segment of the wrong size was
refused in the decoder's words ("index out of bounds", "the end of the data was reached"), naming no size.
appliance/dicom/rlecheck.py, docs/dicom.md "RLE".
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pydicom.encaps import encapsulate
from pydicom.uid import RLELossless

from appliance.dicom import parse
from appliance.dicom.rlecheck import DECODE_CAP_BYTES, rle_first_segment, rle_segments_swapped, rle_size_problem
from appliance.errors import DicomError
from appliance.tools import synthetic
from tests.dicom_testkit import make_dataset, to_bytes


def _segment(plane: np.ndarray) -> bytes:
    """PackBits with literal runs only: valid RLE that every decoder reads (PS3.5 G.3.1)."""
    data = plane.astype(np.uint8).tobytes()
    out = b"".join(bytes([len(chunk) - 1]) + chunk for chunk in (data[i:i + 128] for i in range(0, len(data), 128)))
    return out + b"\x00" * (len(out) % 2)


def _frame(first: bytes, second: bytes) -> bytes:
    header = struct.pack("<16I", 2, 64, 64 + len(first), *([0] * 13))
    return header + first + second


def _file(stored: np.ndarray, *, swap: bool = False, high: np.ndarray | None = None, rows: int | None = None,
          cut: int = 0) -> bytes:
    """An RLE Lossless file of the 16-bit ``stored`` values (Bits Stored 12), segments in order unless ``swap``.

    ``rows`` overrides the header's Rows; ``cut`` drops that many bytes from the end of the second segment.
    """
    words = stored.view(np.uint16)
    hi = (words >> 8) if high is None else high
    lo = words & 0xFF
    first, second = (_segment(lo), _segment(hi)) if swap else (_segment(hi), _segment(lo))
    second = second[:len(second) - cut]
    ds = make_dataset(pixels=stored)
    if rows is not None:
        ds.Rows = rows
    ds.PixelData = encapsulate([_frame(first, second)])
    ds.file_meta.TransferSyntaxUID = RLELossless
    return to_bytes(ds)


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the length of every segment given to pylibjpeg-rle's ``decode_segment``."""
    import rle.rle  # type: ignore[import-not-found]

    calls: list[int] = []
    real = rle.rle.decode_segment

    def counting(data: bytes) -> bytes:
        calls.append(len(data))
        return real(data)  # type: ignore[no-any-return]

    monkeypatch.setattr(rle.rle, "decode_segment", counting)
    return calls


def _ct(signed: bool = False) -> np.ndarray:
    values = synthetic.stored_values(synthetic.generate_slice(3, size=256)).astype(np.int32)
    assert values.max() < 2048 + 1024  # fits 12 bits signed after the shift below
    return (values - 1024).astype(np.int16) if signed else values.astype(np.uint16)


@pytest.mark.parametrize("signed", [False, True])
def test_an_rle_frame_in_the_right_order_decodes_exactly(signed: bool) -> None:
    stored = _ct(signed)
    assert np.array_equal(parse(_file(stored)).decode_frame(0), stored)


@pytest.mark.parametrize("signed", [False, True])
def test_an_rle_frame_with_its_low_bytes_first_is_refused(signed: bool) -> None:
    stored = _ct(signed)
    with pytest.raises(DicomError, match=r"frame 0 \(RLE Lossless\): the segments are in the wrong order"):
        parse(_file(stored, swap=True)).decode_frame(0)


def test_overlay_bits_above_bits_stored_are_masked_as_before_not_refused() -> None:
    """Bits above Bits Stored may hold anything (PS3.5 8.1.1; old overlays): masked, never taken for a swap."""
    stored = _ct()
    high = (stored >> 8).astype(np.uint8)
    high[40:60, :] |= 0x80  # an overlay band: bit 15 set on 8 % of the samples
    assert np.array_equal(parse(_file(stored, high=high)).decode_frame(0), stored)


def test_the_check_decodes_only_the_high_byte_segment_of_an_ordinary_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_decodes(monkeypatch)
    stored = _ct()
    words = stored.view(np.uint16)
    frame = _frame(_segment(words >> 8), _segment(words & 0xFF))
    assert not rle_segments_swapped(frame, stored.size, 12, False)
    assert len(calls) == 1


@pytest.mark.parametrize(("rows", "message"), [
    (128, r"\(0028,0010\) Rows x \(0028,0011\) Columns = 128 x 256\): RLE segment 1 of 2 decodes to more than the "
          r"32768 bytes the header's size needs"),
    (300, r"= 300 x 256\): RLE segment 1 of 2 decodes to 65536 bytes, the header's size needs 76800"),
])
def test_an_rle_frame_whose_segments_do_not_hold_rows_x_columns_bytes_names_the_segment_and_sizes(
        rows: int, message: str) -> None:
    with pytest.raises(DicomError, match=message):
        parse(_file(_ct(), rows=rows)).decode_frame(0)


def test_an_rle_segment_cut_inside_a_run_is_named() -> None:
    with pytest.raises(DicomError, match=r"RLE segment 2 of 2 ends inside a run after 65472 of its 65536 bytes"):
        parse(_file(_ct(), cut=64)).decode_frame(0)


def test_the_size_of_a_segment_is_counted_from_its_run_headers_and_stops_past_the_frame() -> None:
    # two million bytes of replicate runs claim 128 MB: counted without decoding, and only just past the frame
    bomb = b"\x81\x00" * 1_000_000
    frame = _frame(bomb, bomb)
    assert "segment 1 of 2 decodes to more than the 65536 bytes" in (rle_size_problem(frame, 65536) or "")
    words = _ct().view(np.uint16)
    assert rle_size_problem(_frame(_segment(words >> 8), _segment(words & 0xFF)), words.size) is None  # padded


def test_a_frame_is_decoded_once_and_its_high_byte_segment_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    # the size check and the order check share one decode of the first segment (docs/dicom.md, "RLE")
    calls = _count_decodes(monkeypatch)
    stored = _ct()
    assert np.array_equal(parse(_file(stored)).decode_frame(0), stored)
    assert len(calls) == 1


def test_a_first_segment_that_could_claim_more_than_the_cap_is_counted_before_it_is_decoded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_decodes(monkeypatch)
    bomb = b"\x81\x00" * (DECODE_CAP_BYTES // 64)  # 2 MB claiming 128 MB
    high, problem = rle_first_segment(_frame(bomb, _segment(np.zeros(65536))), 65536)
    assert high is None and "segment 1 of 2 decodes to more than the 65536 bytes" in (problem or "")
    assert calls == []
