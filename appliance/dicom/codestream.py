"""Read the size a compressed frame declares in its own codestream, before any decoder sees it.

The DICOM header (Rows, Columns, Samples per Pixel, Bits Allocated) is what the limits are checked against, but a
decoder allocates what the *codestream* declares. A 762-byte JPEG-LS file whose header says 16 x 16 and whose
stream says 20000 x 20000 makes the decoder allocate gigabytes (docs/robustness.md). So every compressed frame is
checked here first: the codec's own size header must agree with the DICOM header, and a frame that lacks its
end-of-image marker is truncated (most decoders would return partial pixels without complaint).

Only headers are read: the cost is a few microseconds per frame, whatever the frame's size.

Supported: JPEG (SOF0..SOF15 except DHT/JPG/DAC; the hierarchical frames are refused), JPEG-LS (SOF55), JPEG 2000
and HTJ2K (SIZ, raw codestream or inside a JP2 ``jp2c`` box; subsampled components are refused), RLE (the 64-byte
segment header).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pydicom import uid as _uid

from appliance.dicom.streamend import MAX_PAD, j2k_end_before_another, jpeg_end, trailing_bytes

__all__ = ["SOF_MARKERS", "FrameGeometry", "StreamError", "check_frame", "j2k_reversible_levels", "segments",
           "stream_kind"]


class StreamError(ValueError):
    """The codestream contradicts the DICOM header or is malformed; the message says how."""


@dataclass(frozen=True)
class FrameGeometry:
    """What the DICOM header says one frame is."""

    rows: int
    columns: int
    samples: int  # samples per pixel
    bits_allocated: int
    bits_stored: int
    pixel_representation: int = 0  # (0028,0103): 1 = signed samples


_JPEG = frozenset({_uid.JPEGBaseline8Bit, _uid.JPEGExtended12Bit, _uid.JPEGLossless, _uid.JPEGLosslessSV1})
_JPEGLS = frozenset({_uid.JPEGLSLossless, _uid.JPEGLSNearLossless})
_J2K = frozenset({_uid.JPEG2000Lossless, _uid.JPEG2000, _uid.HTJ2KLossless, _uid.HTJ2KLosslessRPCL, _uid.HTJ2K})
# SOF markers: C0-C3, C5-C7, C9-CB, CD-CF (C4 DHT, C8 JPG, CC DAC are not frames); F7 is JPEG-LS SOF55.
SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# Hierarchical JPEG (DHP, EXP and the differential frames SOF5-7, SOF13-15) is no DICOM JPEG process: its DHP
# declares a size of its own that the SOF check never sees (a 20 KB frame made a worker map 1.85 GB).
_HIERARCHICAL = frozenset({0xDE, 0xDF, 0xC5, 0xC6, 0xC7, 0xCD, 0xCE, 0xCF})
# Lossless transfer syntaxes: a lossy codestream under one would be scored as exact (held-out review, session 14).
_LOSSLESS = frozenset({_uid.JPEGLossless, _uid.JPEGLosslessSV1, _uid.JPEGLSLossless, _uid.JPEG2000Lossless,
                       _uid.HTJ2KLossless, _uid.HTJ2KLosslessRPCL})
# The frame headers each JPEG transfer syntax's processes use (PS3.5 A.4.1): Baseline is Process 1 only (SOF0);
# Extended is Processes 2 and 4 (SOF1, and SOF0, which an extended decoder reads too). A progressive (SOF2) or
# arithmetic-coded frame under them is another process; the lossless syntaxes' SOF3 is checked in _check_sof.
_JPEG_FRAMES: dict[str, frozenset[int]] = {_uid.JPEGBaseline8Bit: frozenset({0xC0}),
                                           _uid.JPEGExtended12Bit: frozenset({0xC0, 0xC1})}
_SOF_NAMES = {0xC0: "baseline DCT", 0xC1: "extended sequential DCT", 0xC2: "progressive DCT", 0xC3: "lossless",
              0xC9: "extended sequential DCT, arithmetic", 0xCA: "progressive DCT, arithmetic",
              0xCB: "lossless, arithmetic"}
_MAX_J2K_TILES = 1 << 16  # a legitimate image has few tiles; millions of 1x1 tiles is a decoder bomb


def stream_kind(transfer_syntax: str) -> str | None:
    """Return "jpeg", "jpegls", "j2k", "rle" or None (native syntaxes) for a transfer syntax UID."""
    if transfer_syntax in _JPEG:
        return "jpeg"
    if transfer_syntax in _JPEGLS:
        return "jpegls"
    if transfer_syntax in _J2K:
        return "j2k"
    if transfer_syntax == _uid.RLELossless:
        return "rle"
    return None


def check_frame(transfer_syntax: str, frame: bytes, geometry: FrameGeometry) -> None:
    """Raise :class:`StreamError` unless ``frame``'s codestream agrees with ``geometry`` and looks complete.

    Args:
        transfer_syntax: the transfer syntax UID of the instance.
        frame: one whole encapsulated frame (all its fragments, item headers removed).
        geometry: the DICOM header's view of the frame.
    """
    kind = stream_kind(transfer_syntax)
    if kind is None:
        return
    if not frame:
        raise StreamError("the frame is empty")
    if kind == "rle":
        _check_rle(frame, geometry)
        return
    lossless = transfer_syntax in _LOSSLESS
    if kind == "j2k":
        end = _check_j2k(frame, geometry, lossless=lossless)
    else:
        _check_jpeg(frame, geometry, ls=kind == "jpegls", lossless=lossless, sofs=_JPEG_FRAMES.get(transfer_syntax))
    if not _ends_with_eoi(frame):
        raise StreamError("the codestream has no end-of-image marker (FFD9): the frame is truncated")
    if kind != "j2k":
        end = jpeg_end(frame, ls=kind == "jpegls")
    extra = trailing_bytes(frame, end) if end is not None else 0
    if extra:  # one frame, one codestream (docs/dicom.md): what follows its end no decoder reads
        raise StreamError(f"the frame holds {extra} bytes after its codestream's end marker (FFD9), which no decoder "
                          "reads: a further codestream, or more frames than (0028,0008) Number of Frames "
                          "says")


def _ends_with_eoi(frame: bytes) -> bool:
    # Fragments are padded to an even length with 00, and some writers pad with FF or more than one byte (pydicom's
    # own JPGExtended.dcm ends FF D9 FF). FF D9 cannot occur inside JPEG entropy-coded data (FF is stuffed with 00)
    # nor inside a J2K packet body (FF is never followed by a byte above 8F there), so only the marker ends with it.
    tail = frame[-(MAX_PAD + 2):].rstrip(b"\x00\xff")  # the pad that may follow the end (streamend.MAX_PAD)
    return tail.endswith(b"\xff\xd9")


def _mismatch(what: str, stream: int, header: int, header_name: str) -> StreamError:
    return StreamError(f"the codestream says {what} {stream}, the DICOM header says {header_name} = {header}")


def _check_dims(rows: int, cols: int, samples: int, precision: int, g: FrameGeometry) -> None:
    if rows != g.rows:
        raise _mismatch("height", rows, g.rows, "(0028,0010) Rows")
    if cols != g.columns:
        raise _mismatch("width", cols, g.columns, "(0028,0011) Columns")
    if samples != g.samples:
        raise _mismatch("components", samples, g.samples, "(0028,0002) Samples per Pixel")
    if precision > max(g.bits_allocated, 8) or precision < 1:
        raise _mismatch("sample precision", precision, g.bits_allocated, "(0028,0100) Bits Allocated")


def _check_jpeg(frame: bytes, g: FrameGeometry, *, ls: bool, lossless: bool, sofs: frozenset[int] | None = None
                ) -> None:
    """Walk the marker segments from SOI to the first SOF (JPEG) or SOF55 (JPEG-LS).

    ``sofs``: the frame headers the transfer syntax allows (None: any). A lossless frame is read on to its first
    scan header (the point transform, or JPEG-LS's NEAR).
    """
    if frame[:2] != b"\xff\xd8":
        raise StreamError("the codestream does not start with an SOI marker (FFD8)")
    pos, n = 2, len(frame)
    restart = 0  # DRI seen before the frame header
    while pos + 4 <= n:
        if frame[pos] != 0xFF:
            raise StreamError(f"expected a marker at byte {pos} of the codestream")
        marker = frame[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01,) or 0xD0 <= marker <= 0xD8:  # TEM, RSTn, SOI: no length
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", frame, pos + 2)
        if length < 2 or pos + 2 + length > n:
            raise StreamError(f"marker FF{marker:02X} has a length ({length}) that runs past the frame")
        if marker in _HIERARCHICAL:
            raise StreamError(f"the codestream uses hierarchical JPEG (marker FF{marker:02X}), which no DICOM "
                              "transfer syntax allows")
        # an 8-bit extended header (SOF1) decodes exactly as the baseline one; some encoders write it for 8-bit data
        # under Baseline, and refusing it would protect nothing (docs/dicom.md)
        lenient = marker == 0xC1 and 0xC0 in (sofs or ()) and frame[pos + 4] == 8
        if not ls and sofs is not None and marker in SOF_MARKERS and marker not in sofs and not lenient:
            allowed = " or ".join(f"SOF{m - 0xC0} ({_SOF_NAMES[m]})" for m in sorted(sofs))
            raise StreamError(f"the frame header is SOF{marker - 0xC0} (FF{marker:02X}, {_SOF_NAMES[marker]}), but the "
                              f"transfer syntax allows only {allowed}: another JPEG process")
        if (ls and marker == 0xF7) or (not ls and marker in SOF_MARKERS):
            _check_sof(frame, pos, marker, g, ls=ls, lossless=lossless, restart=restart)
            return
        if marker == 0xDD and length >= 4:
            (restart,) = struct.unpack_from(">H", frame, pos + 4)
        if marker == 0xDA:  # start of scan before any frame header
            break
        pos += 2 + length
    raise StreamError("no frame header (SOF) before the first scan: the codestream is malformed")


def _check_sof(frame: bytes, pos: int, marker: int, g: FrameGeometry, *, ls: bool, lossless: bool,
               restart: int) -> None:
    """Check the frame header at ``pos`` against the DICOM header, then a lossless frame's first scan."""
    (length,) = struct.unpack_from(">H", frame, pos + 2)
    if length < 8:
        raise StreamError(f"the frame header FF{marker:02X} is too short")
    precision, rows, cols, samples = struct.unpack_from(">BHHB", frame, pos + 4)
    if rows == 0 or cols == 0:
        raise StreamError("the frame header defers its size (height or width 0): not accepted")
    _check_dims(rows, cols, samples, precision, g)
    if not ls and precision <= 8 < g.bits_allocated:  # pydicom fails with a numpy broadcast error
        raise StreamError(f"the codestream's samples are {precision}-bit, but (0028,0100) Bits Allocated = "
                          f"{g.bits_allocated}: an 8-bit JPEG stream needs Bits Allocated 8")
    if lossless and not ls and marker != 0xC3:
        raise StreamError(f"the transfer syntax is lossless, but the frame header FF{marker:02X} is a DCT "
                          "(lossy) process: only SOF3 is lossless")
    if marker == 0xC3 or (ls and lossless):
        _check_first_scan(frame, pos + 2 + length, ls=ls, restart=restart, columns=cols)


def _check_first_scan(frame: bytes, pos: int, *, ls: bool, restart: int = 0, columns: int = 0) -> None:
    """Read the first scan header after a lossless frame header at ``pos``.

    - JPEG lossless: a restart interval (DRI, in samples) that is not a whole number of rows is refused. The
      predictor restarts mid-row there; pylibjpeg-libjpeg decoded such a stream to wrong pixels without an error
      (232,636 of 262,144 wrong, scored OK), and libjpeg-turbo refuses it (second review, session 14).
    - JPEG lossless: a point transform is refused. pylibjpeg-libjpeg decodes it to wrong values (session 14: at
      Pt = 1 a 12-bit slice came out at about twice its values, at Pt >= 2 the maximum everywhere) without an
      error, where libjpeg-turbo decodes the same streams exactly.
    - JPEG-LS under the lossless syntax: NEAR must be 0. NEAR > 0 is near-lossless, which has its own syntax.
    """
    n = len(frame)
    for marker, at, length in segments(frame, pos):
        if marker == 0xDD and length >= 4:
            (restart,) = struct.unpack_from(">H", frame, at + 4)
        if marker == 0xDA:
            if not ls and restart and columns and restart % columns:
                raise StreamError(f"the lossless scan's restart interval (DRI) is {restart} samples, not a whole "
                                  f"number of rows of {columns}: decoders disagree on such a stream")
            components = frame[at + 4] if at + 4 < n else 0
            after = at + 5 + 2 * components  # Ns, Ns x (Cs, Td/Ta): then Ss Se Ah/Al, or NEAR ILV Ah/Al
            if ls and after < n and frame[after]:
                raise StreamError(f"the transfer syntax is JPEG-LS lossless, but the scan's NEAR is {frame[after]}: "
                                  "a near-lossless (lossy) stream")
            if not ls and after + 2 < n and frame[after + 2] & 0x0F:
                raise StreamError(f"the lossless scan uses a point transform (Pt = {frame[after + 2] & 0x0F}), "
                                  "which the installed decoder (pylibjpeg-libjpeg) decodes to wrong values: not "
                                  "accepted")
            return


def segments(frame: bytes, pos: int) -> Iterator[tuple[int, int, int]]:
    """(marker, position, length) of each JPEG marker segment from ``pos``.

    Fill bytes and markers without a length are skipped; the walk stops quietly at anything that is not a marker
    (entropy-coded data) or at the frame's end.
    """
    n = len(frame)
    while pos + 4 <= n and frame[pos] == 0xFF:
        marker = frame[pos + 1]
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD8:  # a fill byte; TEM, RSTn, SOI
            pos += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack_from(">H", frame, pos + 2)
        yield marker, pos, length
        pos += 2 + length


def _j2k_codestream(frame: bytes) -> int:
    """Return the offset of the SOC marker: 0 for a raw codestream, inside the jp2c box for JP2."""
    if frame[:2] == b"\xff\x4f":
        return 0
    if frame[4:8] == b"jP  ":
        pos = 0
        while pos + 8 <= len(frame):
            length, box = struct.unpack_from(">I4s", frame, pos)
            header = 8
            if length == 1 and pos + 16 <= len(frame):
                (length,) = struct.unpack_from(">Q", frame, pos + 8)
                header = 16
            if box == b"jp2c":
                return pos + header
            if length < header:
                break
            pos += length
    raise StreamError("the codestream does not start with SOC (FF4F) and is not a JP2 file")


def _check_j2k(frame: bytes, g: FrameGeometry, *, lossless: bool) -> int | None:
    """Check the SIZ (and COD under a lossless syntax) and the tile-parts; return the offset just past EOC.

    None when the tile-part walk cannot reach EOC (:func:`_j2k_tiles`) and no second codestream follows.
    """
    start = _j2k_codestream(frame)
    if frame[start : start + 4] != b"\xff\x4f\xff\x51":
        raise StreamError("the J2K codestream does not start with SOC followed by SIZ (FF4F FF51)")
    pos = start + 4
    if pos + 38 > len(frame):
        raise StreamError("the J2K SIZ marker segment is truncated")
    lsiz, _rsiz, xsiz, ysiz, xo, yo, xt, yt, xto, yto, csiz = struct.unpack_from(">HHIIIIIIIIH", frame, pos)
    if lsiz != 38 + 3 * csiz or pos + lsiz > len(frame):
        raise StreamError(f"the J2K SIZ marker length {lsiz} does not match its {csiz} component(s)")
    if xsiz <= xo or ysiz <= yo or xt == 0 or yt == 0 or xto > xo or yto > yo:
        raise StreamError("the J2K SIZ image or tile geometry is inconsistent")
    tiles = -(-(xsiz - xto) // xt) * -(-(ysiz - yto) // yt)
    if tiles > _MAX_J2K_TILES:
        raise StreamError(f"the J2K codestream declares {tiles} tiles (limit {_MAX_J2K_TILES})")
    precisions = []
    for c in range(csiz):
        ssiz, xr, yr = struct.unpack_from(">BBB", frame, pos + 38 + 3 * c)
        if (xr, yr) != (1, 1):  # DICOM frames hold every component at full size; a decoder would upsample
            raise StreamError(f"the J2K SIZ subsamples component {c} by {xr} x {yr}: every component must have "
                              "(0028,0010) Rows x (0028,0011) Columns samples")
        precisions.append((ssiz & 0x7F) + 1)
        if ssiz & 0x80 and not g.pixel_representation:
            # pydicom would read the signed samples as unsigned: a signed 12-bit CT came out 2048..3904 and passed
            # every range check, scored no_nodule 0.9943 for nodule 0.5948 (held-out review, session 19). The
            # reverse (an unsigned stream under a signed header) pydicom corrects, and it is taken
            raise StreamError(f"the J2K SIZ says component {c}'s samples are signed, but (0028,0103) Pixel "
                              "Representation = 0 says unsigned: which one is right cannot be known")
    _check_dims(ysiz - yo, xsiz - xo, csiz, max(precisions, default=0), g)
    if lossless:
        _check_reversible(frame, pos + lsiz, csiz)
    present, end = _j2k_tiles(frame, pos + lsiz, tiles)
    if present is not None and present < tiles:
        raise StreamError(f"the J2K codestream holds {present} of the {tiles} tiles its SIZ declares (the decoder "
                          "would leave the missing ones blank)")
    return end if end is not None else j2k_end_before_another(frame, pos)  # the walk did not reach EOC


def _check_reversible(frame: bytes, pos: int, components: int) -> None:
    """Under a lossless syntax, the main header's COD and COCs must choose the reversible 5/3 wavelet.

    The irreversible 9/7 wavelet is lossy; under JPEG 2000 Lossless it was scored as if exact (held-out review,
    session 14). Tile-part headers can override the choice; they are not read here.
    """
    n = len(frame)
    while pos + 4 <= n and frame[pos] == 0xFF and frame[pos + 1] != 0x90:
        marker = frame[pos + 1]
        (length,) = struct.unpack_from(">H", frame, pos + 2)
        # COD: Scod, SGcod (4 bytes), then levels, code-block w/h, style, transform; COC: Ccoc (1 or 2), Scoc, same
        at = pos + 13 if marker == 0x52 else pos + 4 + (1 if components < 257 else 2) + 5 if marker == 0x53 else 0
        if at and at < min(n, pos + 2 + length) and frame[at] != 1:
            raise StreamError("the transfer syntax is JPEG 2000 lossless, but the codestream's "
                              f"{'COD' if marker == 0x52 else 'COC'} chooses the irreversible 9/7 wavelet (lossy)")
        pos += 2 + length


def j2k_reversible_levels(frame: bytes, precision: int, signed: bool) -> int:
    """Return the wavelet levels of a plain reversible J2K frame, or 0 when a reduced decode would not be plain.

    Plain means: a raw Part 1 codestream (no JP2 wrapper, no Part 2 capabilities) with one component of
    ``precision`` bits (9 to 16), signed as ``signed`` says, a single tile at the canvas origin, and the
    reversible 5/3 wavelet for the whole image (no COC in the main header, no COD or COC in the tile's header).
    Only then is a decode at reduced resolution the 5/3 low-pass band of the whole frame (docs/dicom.md, "JPEG
    2000 at the model's resolution"). Call it after :func:`check_frame`; anything it cannot read gives 0.

    Args:
        frame: one whole encapsulated JPEG 2000 frame (a JP2-wrapped one gives 0).
        precision: the DICOM header's Bits Stored.
        signed: the DICOM header's Pixel Representation is 1.
    """
    if not 9 <= precision <= 16:
        return 0
    if frame[:4] != b"\xff\x4f\xff\x51":  # raw only: Pillow takes a JP2 wrapper's size and depth from its boxes
        return 0
    pos = 4
    try:
        lsiz, rsiz, xsiz, ysiz, xo, yo, xt, yt, xto, yto, csiz = struct.unpack_from(">HHIIIIIIIIH", frame, pos)
        ssiz, xr, yr = struct.unpack_from(">BBB", frame, pos + 38)
    except struct.error:
        return 0
    if rsiz & 0x8000:  # Part 2 extensions (other wavelets, non-linear point transforms)
        return 0
    if csiz != 1 or (xr, yr) != (1, 1) or (ssiz & 0x7F) + 1 != precision or bool(ssiz & 0x80) != signed:
        return 0
    if xo or yo or xto or yto or xt < xsiz or yt < ysiz:
        return 0
    levels = 0
    pos += lsiz  # the first marker after SIZ
    n = len(frame)
    while pos + 4 <= n and frame[pos] == 0xFF:
        marker = frame[pos + 1]
        if marker == 0x90:  # SOT: the tile's header follows, up to SOD
            pos += 2 + struct.unpack_from(">H", frame, pos + 2)[0]
            continue
        if marker == 0x93:  # SOD: both headers read
            return levels
        (length,) = struct.unpack_from(">H", frame, pos + 2)
        if marker == 0x53 or (marker == 0x52 and levels):  # COC, or a tile COD overriding the main one
            return 0
        if marker == 0x52:
            if length < 12 or pos + 14 > n or frame[pos + 13] != 1:  # SPcod transform: 1 = 5/3 reversible
                return 0
            levels = frame[pos + 9]
            if not levels:
                return 0
        pos += 2 + length
    return 0


def _j2k_tiles(frame: bytes, pos: int, tiles: int) -> tuple[int | None, int | None]:
    """Count the distinct tiles with a tile-part, hopping from SOT to SOT by their lengths (no entropy data read).

    A tile whose SOT declares its number of tile-parts (TNsot) must have them all: a dropped last tile-part (the
    fine resolution levels) decoded without an error to a blurred image (held-out review, session 14).
    Returns (tiles, the offset just past EOC); the count is None when the marker structure is not what the walk
    understands (the decoder then judges the stream), the offset None also when the last tile-part's Psot is 0.
    """
    n = len(frame)
    while pos + 4 <= n and frame[pos] == 0xFF and frame[pos + 1] != 0x90:  # main header marker segments
        pos += 2 + struct.unpack_from(">H", frame, pos + 2)[0]
    parts: dict[int, int] = {}  # tile -> tile-parts seen
    declared: dict[int, int] = {}  # tile -> TNsot, where a tile-part declared it
    end: int | None = None
    for _ in range(1 << 20):  # at most 255 tile-parts for each of at most _MAX_J2K_TILES tiles: far below this
        if pos + 12 > n or frame[pos : pos + 2] != b"\xff\x90":  # the walk ends at EOC, or gives up
            if frame[pos : pos + 2] != b"\xff\xd9":
                return None, None
            end = pos + 2
            break
        isot, psot, _tpsot, tnsot = struct.unpack_from(">HIBB", frame, pos + 4)
        if isot >= tiles:
            raise StreamError(f"a J2K tile-part names tile {isot}, but the SIZ declares {tiles} tiles")
        parts[isot] = parts.get(isot, 0) + 1
        if tnsot:
            declared[isot] = tnsot
        if psot == 0:  # the last tile-part runs to the end of the codestream
            end = None
            break
        pos += psot
    else:
        return None, None
    for tile, want in declared.items():
        if parts[tile] < want:
            raise StreamError(f"J2K tile {tile} has {parts[tile]} of the {want} tile-parts its SOT declares (the "
                              "decoder would leave out what the missing ones hold)")
    return len(parts), end


def _check_rle(frame: bytes, g: FrameGeometry) -> None:
    """The RLE header: segment count = samples x bytes per sample, offsets ascending inside the frame."""
    if len(frame) < 64:
        raise StreamError(f"the RLE frame is {len(frame)} bytes, shorter than its 64-byte header")
    header = struct.unpack_from("<16I", frame, 0)
    n_segments = header[0]
    expected = g.samples * max(1, g.bits_allocated // 8)
    if n_segments != expected:
        raise _mismatch("segments", n_segments, expected, "Samples per Pixel x Bits Allocated / 8")
    offsets = list(header[1 : 1 + n_segments])
    if offsets[0] != 64:
        raise StreamError(f"the first RLE segment starts at {offsets[0]}, not right after the 64-byte header")
    for a, b in zip(offsets, [*offsets[1:], len(frame)], strict=True):
        if not a < b <= len(frame):
            raise StreamError("the RLE segment offsets are not ascending inside the frame")
    if any(header[1 + n_segments :]):
        raise StreamError("the RLE header lists offsets for unused segments")
