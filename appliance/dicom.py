"""Parse, validate and decode DICOM instances from in-memory bytes.

pydicom reads almost anything without complaint (docs/dicom.md): a truncated header becomes an empty
dataset, a patched length field allocates whatever it claims, and "auto" decoding falls through from a
plugin that failed loudly to one that returns wrong pixels quietly (§2). This module is the wall between
network bytes and the preprocessing pipelines:

* :func:`parse` bounds the input, reads it without ``force``, and validates the image pixel module against
  itself and against the pixel data length. Limits on pixels per frame, frames and decoded bytes are
  checked from the header, before anything is decoded.
* :class:`DicomInstance` holds the validated header values and the encoded pixel bytes. Frames are decoded
  one at a time with the plugin chosen for the transfer syntax in :data:`DECODER_PLUGINS`, never "auto".
* Every rejection is an :class:`~appliance.errors.InputError` (INVALID_ARGUMENT) or
  :class:`~appliance.errors.NotApplicable` (FAILED_PRECONDITION, a valid object that is not an image) whose
  message names the tag, transfer syntax or limit, and never carries patient data.

Threading: :func:`parse` holds a module lock while pydicom reads and while the header values are copied
out, because capturing pydicom's warnings (which may quote element values, so must never reach a log) needs
the process-global ``warnings`` state. Elements that :func:`parse` does not need (patient module and the
like) stay unconverted, so their values never reach a warning here. :meth:`DicomInstance.decode_frame`
touches only values copied out at parse time and is safe to call from many worker threads at once.
"""

from __future__ import annotations

import io
import logging
import math
import threading
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pydicom
from pydicom import uid as _uid
from pydicom.datadict import dictionary_description, tag_for_keyword
from pydicom.dataset import Dataset
from pydicom.encaps import get_frame, parse_basic_offsets, parse_fragments
from pydicom.errors import InvalidDicomError
from pydicom.filereader import _read_file_meta_info, read_preamble
from pydicom.pixels import get_decoder
from pydicom.pixels.processing import apply_modality_lut

from appliance.codestream import FrameGeometry, StreamError, check_frame, stream_kind
from appliance.errors import DicomError, LimitExceeded, NotApplicable, UnsupportedTransferSyntax

__all__ = [
    "DECODER_PLUGINS",
    "NATIVE",
    "DicomInstance",
    "DicomLimits",
    "decoder_report",
    "parse",
    "tag_name",
]

logger = logging.getLogger(__name__)

NATIVE = "native"
"""Pseudo plugin name for the uncompressed syntaxes, decoded by pydicom's numpy-only native decoder."""

# NOTE(dicom): one plugin per transfer syntax, never "auto" (docs/dicom.md): a fallback chain turns a
# loud failure (pyjpegls: "Invalid JPEG-LS stream") into silently wrong pixels from the next plugin.
DECODER_PLUGINS: dict[str, str] = {
    _uid.ImplicitVRLittleEndian: NATIVE,
    _uid.ExplicitVRLittleEndian: NATIVE,
    _uid.DeflatedExplicitVRLittleEndian: NATIVE,  # inflated by dcmread (bounded first, see _check_deflate)
    _uid.ExplicitVRBigEndian: NATIVE,
    _uid.RLELossless: "pylibjpeg",  # pylibjpeg-rle: ~7x faster than pydicom's numpy RLE
    _uid.JPEGBaseline8Bit: "pillow",  # 3x faster than pylibjpeg; agrees with gdcm on lossy output
    _uid.JPEGExtended12Bit: "pylibjpeg",  # the only installed plugin that decodes 12-bit
    _uid.JPEGLossless: "pylibjpeg",  # gdcm would be ~2x faster but is 43 MB; not shipped
    _uid.JPEGLosslessSV1: "pylibjpeg",
    _uid.JPEGLSLossless: "pyjpegls",  # fastest, and fails loudly on corrupt streams
    _uid.JPEGLSNearLossless: "pyjpegls",
    _uid.JPEG2000Lossless: "pylibjpeg",  # openjpeg: handles YBR_RCT, fastest on small/colour images
    _uid.JPEG2000: "pylibjpeg",
    _uid.HTJ2KLossless: "pylibjpeg",  # openjpeg is the only HTJ2K decoder pydicom knows
    _uid.HTJ2KLosslessRPCL: "pylibjpeg",
    _uid.HTJ2K: "pylibjpeg",
}

_LOSSY_SYNTAXES = frozenset(
    {_uid.JPEGBaseline8Bit, _uid.JPEGExtended12Bit, _uid.JPEGLSNearLossless, _uid.JPEG2000, _uid.HTJ2K}
)
_PIXEL_KEYWORDS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")
_PHOTOMETRIC_SAMPLES = {
    "MONOCHROME1": 1,
    "MONOCHROME2": 1,
    "PALETTE COLOR": 1,
    "RGB": 3,
    "YBR_FULL": 3,
    "YBR_FULL_422": 3,
    "YBR_PARTIAL_420": 3,
    "YBR_ICT": 3,
    "YBR_RCT": 3,
}
# SOP classes that carry pixel data although their names do not say "Image".
_PIXEL_CLASS_WORDS = ("Image", "Segmentation", "RT Dose", "Parametric Map")
_PARSE_LOCK = threading.Lock()
_ITEM_TAG = b"\xfe\xff\x00\xe0"  # (FFFE,E000) Item, little endian
_FLOAT32_MAX = float(np.finfo(np.float32).max)  # the pipelines compute in float32


def tag_name(keyword: str) -> str:
    """Return ``"(gggg,eeee) Name"`` for a DICOM keyword, the form every error message uses.

    Args:
        keyword: a DICOM data dictionary keyword such as ``"Rows"``.
    """
    tag = tag_for_keyword(keyword)
    if tag is None:
        return keyword
    return f"({tag >> 16:04X},{tag & 0xFFFF:04X}) {dictionary_description(tag)}"


def _ts_label(ts: str) -> str:
    name = _uid.UID(ts).name
    return f"'{name}' ({ts})" if name and name != ts else f"'{ts}'"


@dataclass(frozen=True)
class DicomLimits:
    """Bounds checked before anything is allocated for an input."""

    max_bytes: int = 64 << 20  # encoded size of the whole Part 10 file
    max_pixels_per_frame: int = 4096 * 4096  # Rows x Columns
    max_frames: int = 512  # Number of Frames
    max_decoded_bytes: int = 1 << 30  # all frames, all samples, at the decoded item size
    max_inflated_bytes: int = 256 << 20  # a deflated dataset, inflated (counted in chunks, never held)
    max_items: int = 100_000  # sequence items (and pixel fragments) in the dataset: a parse-time bomb bound


@dataclass(frozen=True, repr=False, eq=False)
class DicomInstance:
    """A parsed and validated DICOM image, not yet decoded.

    Built only by :func:`parse`. The header values below are validated and agree with each other and with the
    pixel data length. ``dataset`` is the full pydicom dataset for callers that need more tags; treat it as
    read-only, and note that it holds patient data (never log it).
    """

    sop_instance_uid: str  # (0008,0018)
    sop_class_uid: str  # (0008,0016)
    transfer_syntax_uid: str  # (0002,0010)
    modality: str  # (0008,0060), "" when absent
    rows: int
    columns: int
    number_of_frames: int  # 1 when (0028,0008) is absent
    samples_per_pixel: int  # 1 or 3
    photometric: str  # as stored (MONOCHROME1/2, PALETTE COLOR, RGB, YBR_*)
    bits_allocated: int
    bits_stored: int
    pixel_representation: int  # 0 unsigned, 1 signed
    pixel_spacing: tuple[float, float] | None  # mm (row spacing, column spacing), when present and valid
    dataset: Dataset
    decoding_plugin: str  # the plugin chosen for the transfer syntax, or NATIVE
    pixel_keyword: str  # PixelData, FloatPixelData or DoubleFloatPixelData
    lossy: bool  # lossy transfer syntax or (0028,2110) Lossy Image Compression = "01"
    _pixels: bytes | memoryview = field(repr=False)
    _opts: dict[str, Any] = field(repr=False)
    _rescale: tuple[tuple[float, float], ...] = field(repr=False)  # per frame, or one for all
    _windows: tuple[tuple[float, float] | None, ...] = field(repr=False)  # per frame, or one for all
    _modality_lut: tuple[int, np.ndarray] | None = field(repr=False)  # (first stored value, float32 table)

    def __repr__(self) -> str:
        """Return shape, syntax and UIDs only; never patient data."""
        return (
            f"DicomInstance(sop_instance_uid={self.sop_instance_uid!r}, sop_class={self.sop_class_uid!r}, "
            f"ts={self.transfer_syntax_uid!r}, modality={self.modality!r}, frames={self.number_of_frames}, "
            f"shape=({self.rows}, {self.columns}, {self.samples_per_pixel}), "
            f"photometric={self.photometric!r}, "
            f"bits={self.bits_stored}/{self.bits_allocated})"
        )

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """Shape of one decoded frame: (rows, columns) or (rows, columns, samples)."""
        if self.samples_per_pixel == 1:
            return (self.rows, self.columns)
        return (self.rows, self.columns, self.samples_per_pixel)

    def rescale(self, index: int) -> tuple[float, float]:
        """Return (slope, intercept) of the modality LUT for frame ``index`` ((1, 0) when absent).

        Per-frame values of enhanced multi-frame objects (Pixel Value Transformation Sequence) are honoured.
        """
        return self._rescale[index if len(self._rescale) > 1 else 0]

    def voi_window(self, index: int) -> tuple[float, float] | None:
        """Return the file's first (center, width) VOI window for frame ``index``, or None.

        None unless (0028,1050) Window Center and (0028,1051) Window Width are present, finite, and the width
        is at least 1 (docs/dicom.md: a width of 0 is common and makes windowing divide by zero).
        """
        return self._windows[index if len(self._windows) > 1 else 0]

    @property
    def modality_lut(self) -> tuple[int, np.ndarray] | None:
        """The (0028,3000) Modality LUT Sequence as (first stored value mapped, float32 table), or None."""
        return self._modality_lut

    def decode_frame(self, index: int) -> np.ndarray:
        """Return the stored values of frame ``index`` (colour frames as RGB), decoded with the chosen plugin.

        Args:
            index: frame number, 0-based.

        Raises:
            IndexError: ``index`` is out of range (a caller bug, not bad input).
            DicomError: the plugin failed on this frame; the message names the transfer syntax and plugin.
        """
        return self.decode_frame_raw(index, raw=False)[0]

    def decode_frame_raw(self, index: int, raw: bool = True) -> tuple[np.ndarray, str]:
        """Return frame ``index`` and the photometric interpretation of the returned array.

        With ``raw=True`` YBR data stays YBR (its first channel is then the luma), which skips pydicom's
        numpy YCbCr->RGB conversion (docs/dicom.md: ~60 ms on a 1536x2048 frame). JPEG 2000 decoders always
        undo YBR_RCT/YBR_ICT themselves and report RGB.

        Args:
            index: frame number, 0-based.
            raw: skip the YBR->RGB conversion.

        Raises:
            IndexError: ``index`` is out of range.
            DicomError: the plugin failed on this frame.
        """
        if not 0 <= index < self.number_of_frames:
            raise IndexError(f"frame index {index} out of range for {self.number_of_frames} frame(s)")
        self._check_stream(index)
        decoder = get_decoder(self.transfer_syntax_uid)
        plugin = "" if self.decoding_plugin == NATIVE else self.decoding_plugin
        try:
            arr, props = decoder.as_array(
                self._pixels, index=index, validate=True, raw=raw, decoding_plugin=plugin, **self._opts
            )
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException as e:  # noqa: BLE001 - a Rust panic (pyo3 PanicException) is a BaseException too
            raise DicomError(
                f"cannot decode frame {index} of {tag_name('PixelData')} with transfer syntax "
                f"{_ts_label(self.transfer_syntax_uid)} using plugin {self.decoding_plugin!r}: "
                f"{type(e).__name__}: {_first_line(e)}",
                field="dicom.PixelData",
            ) from e
        if arr.shape != self.frame_shape:
            raise DicomError(
                f"{tag_name('PixelData')} frame {index} decoded to shape {arr.shape}, header says "
                f"{self.frame_shape} (transfer syntax {_ts_label(self.transfer_syntax_uid)}, "
                f"plugin {self.decoding_plugin!r})",
                field="dicom.PixelData",
            )
        return arr, str(props.get("photometric_interpretation", self.photometric))

    def _check_stream(self, index: int) -> None:
        """Check frame ``index``'s codestream header against the DICOM header before any decoder runs."""
        if stream_kind(self.transfer_syntax_uid) is None:
            return
        try:
            encapsulated = cast(bytes, self._pixels)  # only native pixel data is held as a memoryview
            frame = get_frame(encapsulated, index, number_of_frames=self.number_of_frames,
                              extended_offsets=self._opts.get("extended_offsets"))
            check_frame(self.transfer_syntax_uid, frame, FrameGeometry(
                self.rows, self.columns, self.samples_per_pixel, self.bits_allocated, self.bits_stored))
        except StreamError as e:
            raise DicomError(
                f"{tag_name('PixelData')} frame {index} ({_ts_label(self.transfer_syntax_uid)}): {e}",
                field="dicom.PixelData",
            ) from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - malformed fragments
            raise DicomError(
                f"cannot locate frame {index} in {tag_name('PixelData')}: {type(e).__name__}: {_first_line(e)}",
                field="dicom.PixelData",
            ) from None


def _first_line(e: BaseException) -> str:
    # Decoder messages are about codestreams, not element values; keep them short anyway.
    text = str(e).strip().splitlines()
    return " ".join(line.strip() for line in text[:3])[:300] if text else ""


# --------------------------------------------------------------------------------------------------------
# decoder report


def decoder_report() -> dict[str, dict[str, Any]]:
    """Return, per accepted transfer syntax UID, the chosen plugin and whether it can be used here.

    Each value is ``{"name": ..., "plugin": ..., "available": bool, "missing": str | None, "others": [...]}``
    where ``missing`` is pydicom's own text such as ``"pyjpegls - requires pyjpegls"`` and ``others`` lists
    the installed plugins deliberately not used. For ``appliance doctor`` and the startup log.
    """
    report: dict[str, dict[str, Any]] = {}
    for ts, plugin in DECODER_PLUGINS.items():
        report[ts] = _plugin_status(ts, plugin)
    return report


def _plugin_status(ts: str, plugin: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": _uid.UID(ts).name, "plugin": plugin, "available": True, "missing": None}
    try:
        decoder = get_decoder(ts)
    except NotImplementedError:
        entry.update(available=False, missing="pydicom has no decoder for this transfer syntax", others=[])
        return entry
    if plugin == NATIVE:
        entry["others"] = []
        return entry
    available = list(decoder.available_plugins)
    entry["others"] = [p for p in available if p != plugin]
    if plugin not in available:
        missing = [m for m in decoder.missing_dependencies if m.startswith(f"{plugin} ")]
        entry.update(available=False, missing=missing[0] if missing else f"{plugin} - plugin not registered")
    return entry


# --------------------------------------------------------------------------------------------------------
# parse


_DEFAULT_LIMITS = DicomLimits()


def parse(data: bytes | bytearray | memoryview, limits: DicomLimits = _DEFAULT_LIMITS) -> DicomInstance:
    """Parse and validate a DICOM Part 10 file held in memory; decode nothing.

    Args:
        data: the whole file, starting with the 128-byte preamble and ``DICM``.
        limits: size bounds, all checked before pixel memory is allocated.

    Raises:
        DicomError: not DICOM, or a required tag is missing, contradictory or out of range, or the pixel data
            length does not match the header.
        UnsupportedTransferSyntax: the syntax is not accepted, or its plugin is not installed.
        LimitExceeded: over one of ``limits``.
        NotApplicable: valid DICOM that is not an image (RT Plan, SR, DICOMDIR, waveform...).
    """
    data = bytes(data) if not isinstance(data, bytes) else data
    if not data:
        raise DicomError("empty input (0 bytes): not a DICOM Part 10 file")
    if len(data) > limits.max_bytes:
        raise LimitExceeded(f"input is {len(data)} bytes, over the limit max_bytes={limits.max_bytes}")
    if len(data) < 132 or data[128:132] != b"DICM":
        raise DicomError(
            "not a DICOM Part 10 file: no 'DICM' prefix after the 128-byte preamble "
            "(file meta information is required)"
        )
    with _PARSE_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inst = _build(_read(data, limits), limits)
    if caught:
        # Only the count and categories: pydicom's warning texts can quote element values (patient data).
        logger.debug("pydicom emitted %d warning(s) while parsing: %s", len(caught),
                     sorted({w.category.__name__ for w in caught}))
    return inst


def _read(data: bytes, limits: DicomLimits) -> Dataset:
    """Read the file meta, check the syntax, then read the dataset (caller holds the lock)."""
    fp = io.BytesIO(data)
    try:
        read_preamble(fp, False)
        meta = _read_file_meta_info(fp)
    except Exception as e:  # noqa: BLE001 - any failure here means malformed input
        raise DicomError(f"cannot read the file meta information (group 0002): {type(e).__name__}") from e
    ts = meta.get("TransferSyntaxUID")
    if not ts:
        raise DicomError(f"{tag_name('TransferSyntaxUID')} is missing from the file meta information",
                         field="dicom.TransferSyntaxUID")
    _check_syntax(str(ts))
    if ts == _uid.DeflatedExplicitVRLittleEndian:
        _check_deflate(data[fp.tell():], limits)
    else:
        big = data.count(b"\xff\xfe\xe0\x00") if ts == _uid.ExplicitVRBigEndian else 0
        _check_items(data.count(_ITEM_TAG) + big, limits)
    try:
        ds = pydicom.dcmread(io.BytesIO(data), force=False)
    except InvalidDicomError as e:
        raise DicomError(f"not a valid DICOM file: {_first_line(e)}") from e
    except MemoryError:
        raise
    except RecursionError:
        raise LimitExceeded("sequences are nested too deeply to parse", field="dicom") from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - pydicom raises many types on malformed input
        raise DicomError(f"cannot parse the DICOM dataset: {type(e).__name__}") from e
    return ds


def _check_syntax(ts: str) -> None:
    plugin = DECODER_PLUGINS.get(ts)
    if plugin is None:
        accepted = ", ".join(sorted(_uid.UID(u).name for u in DECODER_PLUGINS))
        raise UnsupportedTransferSyntax(
            f"{tag_name('TransferSyntaxUID')} {_ts_label(ts)} is not accepted; accepted: {accepted}",
            field="dicom.TransferSyntaxUID",
        )
    status = _plugin_status(ts, plugin)
    if not status["available"]:
        raise UnsupportedTransferSyntax(
            f"{tag_name('TransferSyntaxUID')} {_ts_label(ts)} needs decoder plugin {plugin!r}, which is not "
            f"usable here: {status['missing']}",
            field="dicom.TransferSyntaxUID",
        )


def _check_items(count: int, limits: DicomLimits) -> None:
    """Refuse a dataset with more item tags than ``max_items``, before pydicom parses it.

    A 27 KB deflated file with 400,000 tiny sequence items takes seconds to parse. Counting the byte pattern
    is an upper bound.
    """
    if count > limits.max_items:
        raise LimitExceeded(
            f"the dataset holds {count} sequence items (FFFE,E000), over the limit max_items={limits.max_items}",
            field="dicom",
        )


def _check_deflate(body: bytes, limits: DicomLimits) -> None:
    """Inflate a deflated body in chunks, counting bytes and item tags and keeping nothing.

    pydicom's own inflate is unbounded (a 523 KB file can carry a 512 MiB element), so the size is proven
    within ``max_inflated_bytes`` first; pydicom inflates it again only after that.
    """
    bound = limits.max_inflated_bytes
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    size = items = 0
    tail = b""
    pending = body
    try:
        while pending or not inflater.eof:
            chunk = inflater.decompress(pending, 1 << 20)
            pending = inflater.unconsumed_tail
            if not chunk:
                break
            size += len(chunk)
            if size > bound:
                raise LimitExceeded(
                    f"deflated dataset inflates to more than {bound} bytes (limit max_inflated_bytes={bound})",
                    field="dicom",
                )
            joined = tail + chunk
            items += joined.count(_ITEM_TAG) - tail.count(_ITEM_TAG)
            tail = joined[-3:]
    except zlib.error as e:
        raise DicomError(f"deflated dataset does not inflate: {e}") from e
    _check_items(items, limits)


def _is_pixel_class(sop_class: str) -> bool:
    name = _uid.UID(sop_class).name
    return any(word in name for word in _PIXEL_CLASS_WORDS)


def _identify(ds: Dataset) -> tuple[str, str, str]:
    """Return (transfer syntax, SOP class, SOP instance) or raise for a non-image / unidentifiable object."""
    ts = str(ds.file_meta.TransferSyntaxUID)
    if len(ds) == 0:
        raise DicomError("the dataset has no data elements after the file meta information (truncated?)")
    sop_class = ds.get("SOPClassUID")
    if not sop_class:
        media = str(ds.file_meta.get("MediaStorageSOPClassUID", ""))
        if media == _uid.MediaStorageDirectoryStorage:
            raise NotApplicable("a DICOMDIR (Media Storage Directory Storage) is an index, not an image")
        raise DicomError(f"{tag_name('SOPClassUID')} is missing", field="dicom.SOPClassUID")
    sop_class = str(sop_class)
    present = [kw for kw in _PIXEL_KEYWORDS if kw in ds]
    if not present:
        label = f"'{_uid.UID(sop_class).name}' ({sop_class})"
        if _is_pixel_class(sop_class):
            raise DicomError(f"{tag_name('PixelData')} is missing from a {label} object",
                             field="dicom.PixelData")
        raise NotApplicable(f"SOP class {label} has no {tag_name('PixelData')}: not an image")
    if len(present) > 1:
        raise DicomError(f"only one of {', '.join(tag_name(k) for k in present)} may be present",
                         field="dicom.PixelData")
    sop_instance = ds.get("SOPInstanceUID")
    if not sop_instance:
        raise DicomError(f"{tag_name('SOPInstanceUID')} is missing", field="dicom.SOPInstanceUID")
    return ts, sop_class, str(sop_instance)


def _req_int(ds: Dataset, keyword: str, lo: int, hi: int) -> int:
    if keyword not in ds or ds[keyword].value in (None, ""):
        raise DicomError(f"{tag_name(keyword)} is missing or empty", field=f"dicom.{keyword}")
    value = ds[keyword].value
    if isinstance(value, bool) or not isinstance(value, int):
        raise DicomError(f"{tag_name(keyword)} must be a single integer", field=f"dicom.{keyword}")
    if not lo <= value <= hi:
        raise DicomError(f"{tag_name(keyword)} = {value} is out of range [{lo}, {hi}]",
                         field=f"dicom.{keyword}")
    return value


def _number_of_frames(ds: Dataset) -> int:
    if "NumberOfFrames" not in ds:
        return 1
    value = ds["NumberOfFrames"].value
    try:
        frames = int(value)
    except (TypeError, ValueError):
        raise DicomError(f"{tag_name('NumberOfFrames')} is not an integer",
                         field="dicom.NumberOfFrames") from None
    if frames < 1:
        raise DicomError(f"{tag_name('NumberOfFrames')} = {frames} must be at least 1",
                         field="dicom.NumberOfFrames")
    return frames


@dataclass(frozen=True)
class _PixelModule:
    rows: int
    columns: int
    samples: int
    photometric: str
    bits_allocated: int
    bits_stored: int
    pixel_representation: int
    planar_configuration: int
    frames: int
    keyword: str

    @property
    def bytes_per_sample(self) -> int:
        return max(1, self.bits_allocated // 8)  # 1-bit data decodes to uint8


def _pixel_module(ds: Dataset, keyword: str) -> _PixelModule:
    rows = _req_int(ds, "Rows", 1, 0xFFFF)
    columns = _req_int(ds, "Columns", 1, 0xFFFF)
    samples = _req_int(ds, "SamplesPerPixel", 1, 3)
    if samples == 2:
        raise DicomError(f"{tag_name('SamplesPerPixel')} = 2 is not valid (must be 1 or 3)",
                         field="dicom.SamplesPerPixel")
    photometric = str(ds.get("PhotometricInterpretation") or "").strip()
    if photometric not in _PHOTOMETRIC_SAMPLES:
        raise DicomError(
            f"{tag_name('PhotometricInterpretation')} {photometric!r} is missing or not supported",
            field="dicom.PhotometricInterpretation",
        )
    if _PHOTOMETRIC_SAMPLES[photometric] != samples:
        raise DicomError(
            f"{tag_name('PhotometricInterpretation')} {photometric!r} needs {tag_name('SamplesPerPixel')} = "
            f"{_PHOTOMETRIC_SAMPLES[photometric]}, got {samples}",
            field="dicom.SamplesPerPixel",
        )
    bits_allocated = _req_int(ds, "BitsAllocated", 1, 64)
    if keyword == "PixelData":
        if bits_allocated != 1 and bits_allocated % 8:
            raise DicomError(f"{tag_name('BitsAllocated')} = {bits_allocated} must be 1 or a multiple of 8",
                             field="dicom.BitsAllocated")
        bits_stored = _req_int(ds, "BitsStored", 1, 64)
        if bits_stored > bits_allocated:
            raise DicomError(
                f"{tag_name('BitsStored')} = {bits_stored} is greater than {tag_name('BitsAllocated')} = "
                f"{bits_allocated}",
                field="dicom.BitsStored",
            )
        pixel_representation = _req_int(ds, "PixelRepresentation", 0, 1)
    else:
        want = 32 if keyword == "FloatPixelData" else 64
        if bits_allocated != want:
            raise DicomError(f"{tag_name('BitsAllocated')} = {bits_allocated} must be {want} with "
                             f"{tag_name(keyword)}", field="dicom.BitsAllocated")
        bits_stored, pixel_representation = bits_allocated, 0
    if bits_allocated == 1 and samples != 1:
        raise DicomError(f"{tag_name('BitsAllocated')} = 1 needs {tag_name('SamplesPerPixel')} = 1",
                         field="dicom.BitsAllocated")
    planar = ds.get("PlanarConfiguration", 0) if samples == 3 else 0
    if planar not in (0, 1):
        raise DicomError(f"{tag_name('PlanarConfiguration')} must be 0 or 1",
                         field="dicom.PlanarConfiguration")
    return _PixelModule(rows, columns, samples, photometric, bits_allocated, bits_stored,
                        pixel_representation, int(planar or 0), _number_of_frames(ds), keyword)


def _check_limits(pm: _PixelModule, limits: DicomLimits) -> None:
    pixels = pm.rows * pm.columns
    if pixels > limits.max_pixels_per_frame:
        raise LimitExceeded(
            f"{tag_name('Rows')} x {tag_name('Columns')} = {pm.rows} x {pm.columns} = {pixels} pixels per "
            f"frame, over the limit max_pixels_per_frame={limits.max_pixels_per_frame}",
            field="dicom.Rows",
        )
    if pm.frames > limits.max_frames:
        raise LimitExceeded(
            f"{tag_name('NumberOfFrames')} = {pm.frames}, over the limit max_frames={limits.max_frames}",
            field="dicom.NumberOfFrames",
        )
    decoded = pixels * pm.samples * pm.bytes_per_sample * pm.frames
    if decoded > limits.max_decoded_bytes:
        raise LimitExceeded(
            f"decoded pixel data would be {decoded} bytes ({pm.frames} frame(s) of "
            f"{pm.rows} x {pm.columns} x {pm.samples} x {pm.bytes_per_sample} bytes), over the limit "
            f"max_decoded_bytes={limits.max_decoded_bytes}",
            field="dicom.PixelData",
        )


def _frame_length(pm: _PixelModule) -> tuple[int, int]:
    """Return (bytes per frame, bytes for all frames) of native pixel data, as pydicom computes them."""
    per_frame_pixels = pm.rows * pm.columns * pm.samples
    total_pixels = per_frame_pixels * pm.frames
    if pm.bits_allocated == 1:
        per_frame, total = per_frame_pixels // 8, total_pixels // 8 + (total_pixels % 8 > 0)
    else:
        per_frame = per_frame_pixels * (pm.bits_allocated // 8)
        total = total_pixels * (pm.bits_allocated // 8)
    if pm.photometric == "YBR_FULL_422":
        per_frame, total = per_frame // 3 * 2, total // 3 * 2
    return per_frame, total


def _native_pixels(pixels: bytes, pm: _PixelModule) -> memoryview:
    per_frame, expected = _frame_length(pm)
    label = tag_name(pm.keyword)
    if len(pixels) < expected:
        raise DicomError(
            f"{label} is {len(pixels)} bytes, expected {expected} for {pm.frames} frame(s) of "
            f"{pm.rows} x {pm.columns} x {pm.samples} at {tag_name('BitsAllocated')} = {pm.bits_allocated} "
            f"(truncated, or {tag_name('NumberOfFrames')} too large)",
            field=f"dicom.{pm.keyword}",
        )
    if per_frame and len(pixels) - expected >= per_frame:
        held = len(pixels) // per_frame
        raise DicomError(
            f"{tag_name('NumberOfFrames')} = {pm.frames} but {label} holds {held} frames",
            field="dicom.NumberOfFrames",
        )
    # The expected bytes plus the even-length padding byte: pydicom then has no excess to warn about, and
    # big endian OW byte swapping still sees an even length.
    return memoryview(pixels)[: min(len(pixels), expected + expected % 2)]


def _encapsulated_pixels(ds: Dataset, pixels: bytes, pm: _PixelModule, ts: str) -> bytes:
    label = tag_name("PixelData")
    if pm.keyword != "PixelData" or not ds[pm.keyword].is_undefined_length:
        raise DicomError(
            f"{label} is not encapsulated, but transfer syntax {_ts_label(ts)} is compressed",
            field="dicom.PixelData",
        )
    try:
        offsets = parse_basic_offsets(pixels)
        items = io.BytesIO(pixels)  # shares the buffer; parse_fragments wants bytes or a file-like
        items.seek(8 + 4 * len(offsets))
        n_fragments, _ = parse_fragments(items)
    except Exception as e:  # noqa: BLE001 - malformed item structure
        raise DicomError(f"{label} encapsulation is malformed: {type(e).__name__}: {_first_line(e)}",
                         field="dicom.PixelData") from e
    if n_fragments == 0:
        raise DicomError(f"{label} has no fragments", field="dicom.PixelData")
    if offsets and len(offsets) != pm.frames:
        raise DicomError(
            f"{tag_name('NumberOfFrames')} = {pm.frames} but the Basic Offset Table of {label} lists "
            f"{len(offsets)} frames",
            field="dicom.NumberOfFrames",
        )
    if n_fragments < pm.frames:
        raise DicomError(
            f"{tag_name('NumberOfFrames')} = {pm.frames} but {label} has only {n_fragments} fragment(s)",
            field="dicom.NumberOfFrames",
        )
    if ts == _uid.RLELossless and n_fragments != pm.frames:
        raise DicomError(
            f"{tag_name('NumberOfFrames')} = {pm.frames} but RLE {label} has {n_fragments} fragments "
            "(RLE needs exactly one per frame)",
            field="dicom.NumberOfFrames",
        )
    return pixels


def _decode_options(ds: Dataset, pm: _PixelModule, ts: str) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "rows": pm.rows,
        "columns": pm.columns,
        "samples_per_pixel": pm.samples,
        "photometric_interpretation": pm.photometric,
        "bits_allocated": pm.bits_allocated,
        "bits_stored": pm.bits_stored,
        "pixel_representation": pm.pixel_representation,
        "planar_configuration": pm.planar_configuration,
        "number_of_frames": pm.frames,
        "pixel_keyword": pm.keyword,
        "pixel_vr": ds[pm.keyword].VR,
    }
    if "ExtendedOffsetTable" in ds and "ExtendedOffsetTableLengths" in ds:
        eot, eotl = ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths
        if len(eot) != 8 * pm.frames or len(eotl) != 8 * pm.frames:
            raise DicomError(
                f"{tag_name('ExtendedOffsetTable')} does not list {tag_name('NumberOfFrames')} = {pm.frames} "
                "frames",
                field="dicom.ExtendedOffsetTable",
            )
        opts["extended_offsets"] = (eot, eotl)
    return opts


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        value = value[0] if len(value) else None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def _functional_item(ds: Dataset, index: int, sequence: str) -> Dataset | None:
    """Return the item of functional-group ``sequence`` for frame ``index`` (per-frame, else shared)."""
    for groups, i in (("PerFrameFunctionalGroupsSequence", index), ("SharedFunctionalGroupsSequence", 0)):
        seq = ds.get(groups)
        if seq and len(seq) > i and sequence in seq[i] and seq[i][sequence].value:
            item: Dataset = seq[i][sequence].value[0]
            return item
    return None


def _rescale_for(ds: Dataset, index: int) -> tuple[float, float]:
    src: Dataset | None = ds if "RescaleSlope" in ds or "RescaleIntercept" in ds else None
    if src is None:
        src = _functional_item(ds, index, "PixelValueTransformationSequence")
    if src is None:
        return 1.0, 0.0
    slope = _float_or_none(src.get("RescaleSlope", 1.0))
    intercept = _float_or_none(src.get("RescaleIntercept", 0.0))
    if slope is None or slope == 0.0 or abs(slope) > _FLOAT32_MAX:
        raise DicomError(f"{tag_name('RescaleSlope')} must be a finite non-zero float32 number",
                         field="dicom.RescaleSlope")
    if intercept is None or abs(intercept) > _FLOAT32_MAX:
        raise DicomError(f"{tag_name('RescaleIntercept')} must be a finite float32 number",
                         field="dicom.RescaleIntercept")
    return slope, intercept


def _window_for(ds: Dataset, index: int) -> tuple[float, float] | None:
    src: Dataset | None = ds if "WindowWidth" in ds else _functional_item(ds, index, "FrameVOILUTSequence")
    if src is None:
        return None
    center = _float_or_none(src.get("WindowCenter"))
    width = _float_or_none(src.get("WindowWidth"))
    if center is None or width is None or width < 1:
        return None
    return center, width


def _per_frame(values: list[Any]) -> tuple[Any, ...]:
    return (values[0],) if all(v == values[0] for v in values) else tuple(values)


def _modality_lut_table(ds: Dataset, pm: _PixelModule) -> tuple[int, np.ndarray] | None:
    seq = ds.get("ModalityLUTSequence")
    if not seq:
        return None
    try:
        n_entries, first, _bits = (int(v) for v in seq[0].LUTDescriptor)
        n_entries = n_entries or 65536
        if pm.pixel_representation == 1 and first >= 1 << 15:
            first -= 1 << 16  # first mapped value is stored as US even for signed data
        stored = np.arange(first, first + n_entries, dtype=np.int64)
        table = np.asarray(apply_modality_lut(stored, ds), dtype=np.float32)
    except Exception as e:  # noqa: BLE001 - malformed LUT descriptor or data
        raise DicomError(f"{tag_name('ModalityLUTSequence')} is malformed: {type(e).__name__}",
                         field="dicom.ModalityLUTSequence") from e
    if table.shape != (n_entries,):
        raise DicomError(f"{tag_name('ModalityLUTSequence')} LUT Data does not match its LUT Descriptor",
                         field="dicom.ModalityLUTSequence")
    return first, table


def _pixel_spacing(ds: Dataset) -> tuple[float, float] | None:
    spacing = ds.get("PixelSpacing")
    if spacing is None:
        item = _functional_item(ds, 0, "PixelMeasuresSequence")
        spacing = item.get("PixelSpacing") if item is not None else None
    if not isinstance(spacing, Sequence) or isinstance(spacing, str | bytes) or len(spacing) != 2:
        return None
    try:
        row, col = float(spacing[0]), float(spacing[1])
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(row) and math.isfinite(col) and row > 0 and col > 0):
        return None
    return row, col


def _build(ds: Dataset, limits: DicomLimits) -> DicomInstance:
    ts, sop_class, sop_instance = _identify(ds)
    for tag in [t for t in ds.keys() if t.group == 0x0028]:
        ds[tag]  # convert the image pixel group (palettes, LUTs) now, under the lock, warnings captured
    keyword = next(kw for kw in _PIXEL_KEYWORDS if kw in ds)
    pm = _pixel_module(ds, keyword)
    _check_limits(pm, limits)
    raw_pixels = ds[keyword].value
    if not isinstance(raw_pixels, bytes | bytearray):
        raise DicomError(f"{tag_name(keyword)} has no readable value", field=f"dicom.{keyword}")
    raw_pixels = bytes(raw_pixels) if isinstance(raw_pixels, bytearray) else raw_pixels
    if _uid.UID(ts).is_encapsulated:
        pixels: bytes | memoryview = _encapsulated_pixels(ds, raw_pixels, pm, ts)
    else:
        pixels = _native_pixels(raw_pixels, pm)
    opts = _decode_options(ds, pm, ts)
    modality_lut = _modality_lut_table(ds, pm) if pm.samples == 1 and keyword == "PixelData" else None
    rescale = _per_frame([_rescale_for(ds, i) for i in range(pm.frames)])
    windows = _per_frame([_window_for(ds, i) for i in range(pm.frames)])
    lossy = ts in _LOSSY_SYNTAXES or str(ds.get("LossyImageCompression", "")).strip() == "01"
    return DicomInstance(
        sop_instance_uid=sop_instance,
        sop_class_uid=sop_class,
        transfer_syntax_uid=ts,
        modality=str(ds.get("Modality") or ""),
        rows=pm.rows,
        columns=pm.columns,
        number_of_frames=pm.frames,
        samples_per_pixel=pm.samples,
        photometric=pm.photometric,
        bits_allocated=pm.bits_allocated,
        bits_stored=pm.bits_stored,
        pixel_representation=pm.pixel_representation,
        pixel_spacing=_pixel_spacing(ds),
        dataset=ds,
        decoding_plugin=DECODER_PLUGINS[ts],
        pixel_keyword=keyword,
        lossy=lossy,
        _pixels=pixels,
        _opts=opts,
        _rescale=rescale,
        _windows=windows,
        _modality_lut=modality_lut,
    )
