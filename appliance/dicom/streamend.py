"""Where a compressed frame's codestream ends, and which fragments no frame reads (docs/dicom.md).

A frame is one codestream. Bytes after the codestream's end marker are read by no decoder: a second codestream
there (two back to back in one frame, or a fragment after the last frame's end) was scored as if it were not
there, the image it holds never seen. So the end is found from the codestream's own structure, not from the
frame's last bytes (which end with FF D9 whatever comes before them):

- JPEG and JPEG-LS: marker segments are skipped by their lengths (an APPn segment can hold a thumbnail with its
  own FF D9), the data between them is searched for the next marker; the first EOI ends the codestream. FF D9
  cannot occur in entropy-coded data: JPEG stuffs a 00 after FF, JPEG-LS clears the top bit of the byte after FF.
- JPEG 2000: tile-parts are hopped by their lengths (Psot) up to EOC (:mod:`appliance.dicom.codestream`); packet
  data is never searched for a marker. A last tile-part of unknown length (Psot = 0) runs to the frame's end; there
  only an EOC followed (after at most pad bytes) by a second codestream's SOC and SIZ (FF 4F FF 51) is looked for.

Only markers are looked for (regular expressions over the bytes, no Python loop per byte): no decoding.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

from appliance.dicom.syntaxes import tag_name
from appliance.errors import DicomError

__all__ = ["MAX_PAD", "check_fragments_read", "fragments_after_frames", "j2k_end_before_another", "jpeg_end",
           "trailing_bytes"]

#: Pad bytes (00 or FF) a frame may carry after its end marker: an even-length fragment's 00, and some writers'
#: FF (pydicom's own JPGExtended.dcm ends FF D9 FF). Anything else after the end is refused.
MAX_PAD = 62

# The next marker: FF and a byte that is neither a fill (FF) nor RSTn (D0-D7, part of the entropy-coded data) nor
# JPEG's stuffed 00 (JPEG-LS: nor a byte below 80, whose top bit its bit stuffing clears).
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_JPEGLS_MARKER = re.compile(rb"\xff[\x80-\xcf\xd8-\xfe]")
_EOI = 0xD9
_J2K_EOC_SOC_SIZ = re.compile(rb"\xff\xd9[\x00\xff]{0,%d}?\xff\x4f\xff\x51" % MAX_PAD)


def jpeg_end(frame: bytes, *, ls: bool) -> int | None:
    """Return the offset just past the first EOI of the JPEG (or JPEG-LS) codestream in ``frame``, or None.

    None when no EOI is found (a truncated frame, or a segment length that runs past the frame).
    """
    pattern = _JPEGLS_MARKER if ls else _JPEG_MARKER
    n, pos = len(frame), 2  # after SOI
    while True:
        found = pattern.search(frame, pos)
        if found is None:
            return None
        at = found.start()
        marker = frame[at + 1]
        if marker == _EOI:
            return at + 2
        if marker in (0x01, 0xD8):  # TEM, SOI: no length
            pos = at + 2
            continue
        if at + 4 > n:
            return None
        pos = at + 2 + struct.unpack_from(">H", frame, at + 2)[0]
        if pos > n:
            return None


def j2k_end_before_another(frame: bytes, pos: int) -> int | None:
    """Return the offset just past an EOC that (pad bytes aside) a second J2K codestream follows, or None."""
    found = _J2K_EOC_SOC_SIZ.search(frame, pos)
    return None if found is None else found.start() + 2


def trailing_bytes(frame: bytes, end: int) -> int:
    """Return 0 when at most :data:`MAX_PAD` pad bytes (00 or FF) follow ``end``, else the bytes after it."""
    tail = frame[end:]
    return 0 if len(tail) <= MAX_PAD and not tail.strip(b"\x00\xff") else len(tail)


def fragments_after_frames(pixels: bytes, positions: Sequence[int], frames: int) -> int:
    """Fragments past the last frame when frames are found by their end markers (no offset table), else 0.

    Without an offset table and with more fragments than frames, pydicom ends a frame at each fragment whose last
    10 bytes hold FF D9, and ignores the fragments after the last frame's: a further codestream there would never
    be decoded. ``positions`` are the fragment items' offsets in ``pixels`` (item tag first).
    """
    if frames < 2 or len(positions) <= frames:
        return 0
    ended = 0
    for i, at in enumerate(positions):
        (length,) = struct.unpack_from("<I", pixels, at + 4)
        if b"\xff\xd9" in pixels[max(at + 8, at + 8 + length - 10) : at + 8 + length]:
            ended += 1
            if ended == frames:
                return len(positions) - i - 1
    return 0


def check_fragments_read(pixels: bytes, frames: int, positions: Sequence[int], *, basic_table: bool,
                         extended_table: bool) -> None:
    """Refuse fragments that no frame reads: pydicom would drop them, and any codestream in them.

    An Extended Offset Table reads one fragment per frame; without any table, frames end at the fragments whose last
    bytes hold an end marker (FF D9), and the fragments after the last frame's are never read.
    """
    if extended_table and len(positions) != frames:
        extra = f"{tag_name('ExtendedOffsetTable')} reads one fragment per frame, but there are {len(positions)}"
    elif not basic_table and (left := fragments_after_frames(pixels, positions, frames)):
        extra = f"{left} fragment(s) follow the end marker (FFD9) of the last frame"
    else:
        return
    raise DicomError(f"{tag_name('NumberOfFrames')} = {frames} but {tag_name('PixelData')} holds more: {extra}, "
                     "which no frame reads", field="dicom.NumberOfFrames")
