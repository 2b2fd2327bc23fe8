"""Does a JPEG frame's entropy-coded data run to its end? Two checks, since the decoders fill lost data silently.

A JPEG frame that lost bytes from its middle (a dropped fragment, a cut that kept the FFD9 end marker) still passes
the header checks (:mod:`appliance.dicom.codestream`), and Pillow and pylibjpeg decode it without an error: libjpeg
reports "premature end of data segment" as a *warning* and fills the rest of the image (docs/robustness.md).

- 8-bit frames (baseline and lossless): :func:`jpeg_data_lost` decodes the frame once more with simplejpeg
  (libjpeg-turbo, ``strict=True``: warnings raise) and refuses it on the warnings that mean lost or corrupt data.
  Pillow drops libjpeg's warnings; simplejpeg has no 12- or 16-bit path.
- Lossless frames of any precision (SOF3, one component): :func:`lossless_data_lost` counts the bits the decoded
  samples need under the frame's own Huffman table and predictor. Every sample costs at least one bit, so samples
  the decoder made up need more bits than the data holds. 12-bit DCT frames (SOF1) have no such check.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

from appliance.dicom.codestream import SOF_MARKERS, segments

__all__ = ["LOST_DATA", "LosslessScan", "jpeg_data_lost", "lossless_bits_needed", "lossless_data_lost",
           "lossless_scan"]

#: libjpeg's warnings that mean the image is not what was encoded (jerror.h: JWRN_HIT_MARKER, JWRN_JPEG_EOF and the
#: Huffman ones). "extraneous bytes before marker" is not among them: some writers pad between segments.
LOST_DATA = ("premature end of data segment", "premature end of jpeg file", "bad huffman code",
             "huffman code size table overflow", "invalid arithmetic code")


def jpeg_data_lost(frame: bytes, samples: int) -> str | None:
    """Return libjpeg-turbo's warning when ``frame`` decodes only by filling in lost data, else None.

    Args:
        frame: one whole JPEG frame (SOI .. EOI).
        samples: the DICOM header's Samples per Pixel (1 decodes to grey, else to RGB).
    """
    import simplejpeg  # imported on first use: only the workers decode

    try:
        simplejpeg.decode_jpeg(frame, colorspace="GRAY" if samples == 1 else "RGB", strict=True)
    except ValueError as e:
        text = str(e)
        if any(warning in text.lower() for warning in LOST_DATA):
            return text
    return None


#: SSSS category (bit length of the magnitude) of every lossless JPEG difference, indexed modulo 2**16.
_MAGNITUDE = np.minimum(np.arange(1 << 16), (1 << 16) - np.arange(1 << 16))
_CATEGORY = np.zeros(1 << 16, dtype=np.int64)
_CATEGORY[1:] = np.floor(np.log2(_MAGNITUDE[1:])).astype(np.int64) + 1
_NO_CODE = 255  # in a per-frame bits table: this category has no Huffman code


@dataclass(frozen=True)
class LosslessScan:
    """What counting a lossless frame's bits needs: its one scan's header, Huffman table and coded data."""

    precision: int  # P, sample precision in bits (SOF3)
    predictor: int  # Ss, 1..7
    point_transform: int  # Pt (Al)
    restart_rows: int  # rows per restart interval, 0 for none
    code_lengths: np.ndarray  # (17,) Huffman code length of each SSSS category, 0 where the table has none
    coded_bits: int  # entropy-coded data in bits, stuffed bytes and RSTn markers removed
    restart_markers: int = 0  # RSTn markers in the entropy-coded data


def lossless_scan(frame: bytes) -> LosslessScan | None:
    """Read a Huffman-coded lossless (SOF3) JPEG frame of one component and one scan, else None.

    None also when the restart interval is not a whole number of rows (the predictor then restarts mid-row; the
    header check refuses such a frame before it is decoded, :mod:`appliance.dicom.codestream`).
    """
    tables: dict[int, np.ndarray] = {}
    sof: tuple[int, int, int, int] | None = None
    restart = 0
    for marker, pos, length in segments(frame, 2):
        segment = frame[pos + 4 : pos + 2 + length]
        if marker in SOF_MARKERS:
            if marker != 0xC3 or len(segment) < 6:
                return None
            sof = struct.unpack_from(">BHHB", segment)
            if sof[3] != 1:
                return None
        elif marker == 0xC4:
            tables.update(_huffman_tables(segment))
        elif marker == 0xDD and len(segment) >= 2:
            (restart,) = struct.unpack_from(">H", segment)
        elif marker == 0xDA:
            if sof is None or len(segment) < 6 or segment[0] != 1:
                return None
            table, predictor, point_transform = segment[2] >> 4, segment[3], segment[5] & 0x0F
            coded = _coded_bits(frame, pos + 2 + length)
            precision, _, columns, _ = sof
            if coded is None or table not in tables or not 1 <= predictor <= 7 or not columns or restart % columns:
                return None
            return LosslessScan(precision, predictor, point_transform, restart // columns, tables[table], *coded)
    return None


def _huffman_tables(segment: bytes) -> dict[int, np.ndarray]:
    """The DC-class tables of one DHT segment: destination -> code length of each SSSS category."""
    out: dict[int, np.ndarray] = {}
    i = 0
    while i + 17 <= len(segment):
        klass, dest = segment[i] >> 4, segment[i] & 0x0F
        counts = segment[i + 1 : i + 17]
        symbols = segment[i + 17 : i + 17 + sum(counts)]
        if klass == 0:
            lengths = np.zeros(17, dtype=np.int64)
            k = 0
            for size, count in enumerate(counts, start=1):
                for symbol in symbols[k : k + count]:
                    if symbol <= 16:
                        lengths[symbol] = size
                k += count
            out[dest] = lengths
        i += 17 + sum(counts)
    return out


#: A marker in entropy-coded data: FF followed by anything but a stuffed 00, RSTn or another (fill) FF.
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _coded_bits(frame: bytes, start: int) -> tuple[int, int] | None:
    """(Bits of entropy-coded data, RSTn markers) from ``start`` to the next marker; None unless it is EOI.

    Stuffed zeros, RSTn markers and fill bytes before the marker are not data. Counted with regular expressions
    and ``bytes.count``: a Python loop per FF byte cost 0.1 s per MB (session 14 review).
    """
    found = _MARKER.search(frame, start)
    if found is None or frame[found.start() + 1] != 0xD9:
        return None
    data = frame[start : found.start()]
    fill = len(data) - len(data.rstrip(b"\xff"))
    restarts = _restart_markers(data)
    removed = data.count(b"\xff\x00") + 2 * restarts + fill
    return (len(data) - removed) * 8, restarts


def _restart_markers(data: bytes) -> int:
    """RSTn markers in entropy-coded data, counted without building a list (a 50 MB flood of them took 1.5 GB)."""
    return sum(data.count(bytes((0xFF, marker))) for marker in range(0xD0, 0xD8))


def lossless_bits_needed(scan: LosslessScan, samples: np.ndarray) -> int | None:
    """Bits the scan's own Huffman table and predictor need to code ``samples``; None if one has no code.

    ``samples`` are the decoded values (rows, columns) as the codec returns them (shifted back by the point
    transform). Differences are taken modulo 2**16 and coded as a category's code plus that many extra bits;
    category 16 has none (ITU-T T.81, H.1.2).
    """
    v = samples.astype(np.int32) >> scan.point_transform
    rows = v.shape[0]
    pred = np.empty_like(v)
    pred[1:, 0] = v[:-1, 0]
    ra, rb, rc = v[1:, :-1], v[:-1, 1:], v[:-1, :-1]
    if scan.predictor == 1:
        pred[1:, 1:] = ra
    elif scan.predictor == 2:
        pred[1:, 1:] = rb
    elif scan.predictor == 3:
        pred[1:, 1:] = rc
    elif scan.predictor == 4:
        pred[1:, 1:] = ra + rb - rc
    elif scan.predictor == 5:
        pred[1:, 1:] = ra + ((rb - rc) >> 1)
    elif scan.predictor == 6:
        pred[1:, 1:] = rb + ((ra - rc) >> 1)
    else:
        pred[1:, 1:] = (ra + rb) >> 1
    for r in range(0, rows, scan.restart_rows or rows):  # a scan's and a restart interval's first row: left only
        pred[r, 0] = 1 << (scan.precision - scan.point_transform - 1)
        pred[r, 1:] = v[r, :-1]
    np.subtract(v, pred, out=pred)
    extra = np.arange(17)
    extra[16] = 0
    per_category = np.where(scan.code_lengths > 0, scan.code_lengths + extra, _NO_CODE).astype(np.uint8)
    bits = per_category[_CATEGORY][pred.astype(np.uint16)]
    if bits.max() == _NO_CODE:
        return None
    return int(bits.sum(dtype=np.int64))


def lossless_data_lost(frame: bytes, decoded: np.ndarray, bits_stored: int) -> str | None:
    """Return why a lossless JPEG frame's decoded samples cannot have come from its data, else None.

    A decoder that runs out of entropy-coded data fills the rest of the image without an error (pylibjpeg,
    libjpeg-turbo alike). Every sample costs at least one bit, so a frame whose data was cut decodes to samples
    that need more bits, under the frame's own table and predictor, than its data holds. Frames this cannot
    judge (not SOF3, several components or scans, restarts within a row) return None.

    Args:
        frame: one whole JPEG frame (SOI .. EOI).
        decoded: the frame as pydicom returned it, (rows, columns); a signed frame is a signed view of the
            codec's samples, sign-extended from ``bits_stored``.
        bits_stored: (0028,0101) Bits Stored.
    """
    scan = lossless_scan(frame)
    if scan is None or decoded.ndim != 2:
        return None
    allowed = -(-decoded.shape[0] // scan.restart_rows) - 1 if scan.restart_rows else 0
    if scan.restart_markers > allowed:  # a flood of RSTn: 25 million of them held a worker 9 s (session 14)
        return (f"its entropy-coded data holds {scan.restart_markers} restart markers, where its restart interval "
                f"allows {allowed}")
    tries = [decoded.astype(np.int32) & ((1 << scan.precision) - 1)]
    if decoded.dtype.kind == "i" and bits_stored < scan.precision:  # the codec's samples may not have been
        tries.append(decoded.astype(np.int32) & ((1 << bits_stored) - 1))  # sign-extended: pydicom did it
    needs = [n for n in (lossless_bits_needed(scan, t) for t in tries) if n is not None]
    if not needs:
        return "the decoded samples need a difference category that the frame's Huffman table has no code for"
    need = min(needs)
    if need > scan.coded_bits:
        return (f"its entropy-coded data holds {scan.coded_bits} bits, but the decoded samples need {need} under "
                "the frame's own Huffman table and predictor: data was lost and the decoder filled it in")
    if scan.coded_bits - need > _padding_bits(scan, decoded.shape[0]) + max(64, scan.coded_bits // 100):
        return (f"its entropy-coded data holds {scan.coded_bits} bits, but the decoded samples need only {need} "
                "under the frame's own Huffman table and predictor: the decoder stopped before the data ended")
    return None


def _padding_bits(scan: LosslessScan, rows: int) -> int:
    """The most padding an encoder adds: under a byte at the end of each restart interval (T.81 F.1.2.3).

    The check allows 1 % of the data (at least 64 bits) on top, for writers that pad more than they should.
    """
    return 8 * -(-rows // (scan.restart_rows or rows))
