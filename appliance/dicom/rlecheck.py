"""RLE Lossless frames whose byte segments are in the wrong order, or the wrong size (docs/dicom.md, "RLE").

A 16-bit RLE frame holds each sample as two segments, the high bytes first (PS3.5 G.2). An encoder that writes the
low bytes first produces a frame every decoder accepts: the values come out byte-swapped, and pydicom then masks them
to Bits Stored, so a 12-bit CT slice becomes in-range noise that the model scores (0.71 for 0.9989; held-out review,
session 14). Nothing in the header can tell.

The decoded high bytes can. With Bits Stored < 16 the high byte of every sample holds only ``Bits Stored - 8``
significant bits; the bits above them are zero (or, for signed samples, copies of the sign bit). When that holds for
no more than a few samples of the declared high-byte segment but for every sample of the declared low-byte segment,
the two are swapped. A file that keeps overlay bits above Bits Stored (allowed, and masked) passes: its low-byte
segment is not all "high-byte shaped". Only the first segment is decoded on the ordinary path (about 0.25 ms for
512x512 with pylibjpeg-rle); the second only when the first looks wrong.

A frame the decoder refuses is explained by :func:`rle_size_problem`, which counts what each segment would decode
to from its run headers alone (no output is written, so a segment of a few bytes cannot claim gigabytes): the
decoder's own words for it are a Rust panic ("index out of bounds") or "the end of the data was reached".
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["DECODE_CAP_BYTES", "rle_first_segment", "rle_segments_swapped", "rle_size_problem"]

#: The share of high bytes with bits above Bits Stored from which the segment order is looked at (swapped CT slices:
#: over 90 %, since low bytes are near uniform).
SUSPECT_SHARE = 0.25


def _out_of_shape(high: np.ndarray, bits_stored: int, signed: bool) -> np.ndarray:
    """Which bytes cannot be the high byte of a sample with ``bits_stored`` bits (a boolean array)."""
    k = bits_stored - 8  # significant bits in the high byte, 1..7
    above: np.ndarray = (high >> k) != 0
    if not signed:
        return above
    sign_extended: np.ndarray = (high >> (k - 1)) == (1 << (9 - k)) - 1  # the top bits copy a set sign bit
    both: np.ndarray = above & ~sign_extended
    return both


def rle_segments_swapped(frame: bytes, pixels: int, bits_stored: int, signed: bool,
                         high: np.ndarray | None = None) -> bool:
    """Whether a one-sample, 16-bit RLE ``frame`` of ``pixels`` samples has its low-byte segment first.

    Only meaningful for 8 < ``bits_stored`` < 16 (False otherwise). ``frame`` has passed the header check
    (``codestream.check_frame``: two segments, offsets in order) and decoded; a segment that does not decode here
    says nothing about the order (False). ``high`` is the first segment already decoded (:func:`rle_first_segment`).
    """
    if not 8 < bits_stored < 16:
        return False
    first, second = struct.unpack_from("<3I", frame, 0)[1:]
    try:
        if high is None:
            high = _decode(frame[first:second], pixels)
        high = high[:pixels]
        if high.size < pixels or np.count_nonzero(_out_of_shape(high, bits_stored, signed)) < SUSPECT_SHARE * pixels:
            return False
        low = _decode(frame[second:], pixels)[:pixels]
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException:  # noqa: BLE001 - malformed data (ValueError) or a Rust panic (pyo3 PanicException)
        return False
    return low.size == pixels and not _out_of_shape(low, bits_stored, signed).any()


#: A segment whose run headers could claim more than this many bytes (64 per 2 encoded bytes) is counted before the
#: Rust decoder, which grows its output without bound, is given it.
DECODE_CAP_BYTES = 64 << 20


def _decode(segment: bytes, segment_bytes: int) -> np.ndarray:
    """One segment decoded by pylibjpeg-rle; ValueError if it would yield more than ``segment_bytes`` + 1 bytes.

    Raises:
        ValueError: the segment is too long, or malformed (the decoder's own error).
        BaseException: a Rust panic (pyo3 ``PanicException``).
    """
    from rle.rle import decode_segment  # type: ignore[import-not-found]  # pylibjpeg-rle's Rust decoder

    if 64 * len(segment) > DECODE_CAP_BYTES and _decoded_size(segment, segment_bytes + 1)[0] > segment_bytes + 1:
        raise ValueError(f"the segment decodes to more than {segment_bytes + 1} bytes")
    return np.frombuffer(decode_segment(segment), np.uint8)


def rle_first_segment(frame: bytes, segment_bytes: int) -> tuple[np.ndarray | None, str | None]:
    """The first segment of a decoded RLE ``frame``, and why it is refused (None: it is not).

    pylibjpeg-rle stops writing a segment once the frame is full and drops the rest, so a header whose Rows or
    Columns are smaller than the data's decodes to a cut of the image (256 x 256 data under Rows 128: its top
    half). The first segment holds the most significant bytes, so data that does not fit shows there; the others
    are only read on failure (:func:`rle_size_problem`). A segment the decoder refuses here gives (None, None).
    """
    count, first = struct.unpack_from("<2I", frame, 0)
    end = struct.unpack_from("<I", frame, 8)[0] if count > 1 else len(frame)
    try:
        data = _decode(frame[first:end], segment_bytes)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException:  # noqa: BLE001 - malformed data (ValueError) or a Rust panic (pyo3 PanicException)
        return None, rle_size_problem(frame, segment_bytes)
    if data.size > segment_bytes + 1:
        return None, rle_size_problem(frame, segment_bytes)
    return data, None


def _decoded_size(segment: bytes, limit: int) -> tuple[int, bool]:
    """Walk a segment's PackBits run headers without decoding: (bytes it yields, whether its data ends inside a run).

    The count stops once it passes ``limit``.
    """
    i = size = 0
    n = len(segment)
    while i < n and size <= limit:
        header = segment[i]
        if header < 128:  # a literal run of header + 1 bytes
            if i + 2 + header > n:
                return size + n - i - 1, True
            size += header + 1
            i += 2 + header
        elif header > 128:  # one byte repeated 257 - header times
            if i + 1 >= n:
                return size, True
            size += 257 - header
            i += 2
        else:  # 128: no operation
            i += 1
    return size, False


def rle_size_problem(frame: bytes, segment_bytes: int) -> str | None:
    """The first segment of an RLE ``frame`` that does not decode to ``segment_bytes`` bytes, in words; None if all do.

    ``frame`` has passed the header check (``codestream.check_frame``: segment count, offsets in order). A segment
    may yield one byte more (the pad to even length, PS3.5 G.3.1).
    """
    count = struct.unpack_from("<I", frame, 0)[0]
    offsets = [*struct.unpack_from(f"<{count}I", frame, 4), len(frame)]
    for k in range(count):
        size, cut = _decoded_size(frame[offsets[k]:offsets[k + 1]], segment_bytes + 1)
        if cut and size < segment_bytes:
            return (f"RLE segment {k + 1} of {count} ends inside a run after {size} of its {segment_bytes} bytes "
                    "(the frame is cut short or corrupt)")
        if size < segment_bytes:
            return f"RLE segment {k + 1} of {count} decodes to {size} bytes, the header's size needs {segment_bytes}"
        if size > segment_bytes + 1:
            return (f"RLE segment {k + 1} of {count} decodes to more than the {segment_bytes} bytes the header's size "
                    "needs (the size does not match the data, or the segment is corrupt)")
    return None
