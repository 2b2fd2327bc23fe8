"""RLE Lossless frames whose byte segments are in the wrong order (docs/dicom.md, "RLE").

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
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["rle_segments_swapped"]

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


def rle_segments_swapped(frame: bytes, pixels: int, bits_stored: int, signed: bool) -> bool:
    """Whether a one-sample, 16-bit RLE ``frame`` of ``pixels`` samples has its low-byte segment first.

    Only meaningful for 8 < ``bits_stored`` < 16 (False otherwise). ``frame`` has passed the header check
    (``codestream.check_frame``: two segments, offsets in order) and decoded; a segment that does not decode here
    says nothing about the order (False).
    """
    if not 8 < bits_stored < 16:
        return False
    from rle.rle import decode_segment  # type: ignore[import-not-found]  # pylibjpeg-rle's Rust decoder

    first, second = struct.unpack_from("<3I", frame, 0)[1:]
    try:
        high = np.frombuffer(decode_segment(frame[first:second]), np.uint8)[:pixels]
        if high.size < pixels or np.count_nonzero(_out_of_shape(high, bits_stored, signed)) < SUSPECT_SHARE * pixels:
            return False
        low = np.frombuffer(decode_segment(frame[second:]), np.uint8)[:pixels]
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException:  # noqa: BLE001 - malformed data (ValueError) or a Rust panic (pyo3 PanicException)
        return False
    return low.size == pixels and not _out_of_shape(low, bits_stored, signed).any()
