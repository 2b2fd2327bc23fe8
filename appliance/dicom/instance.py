"""A parsed and validated DICOM image (:class:`DicomInstance`) and the bounds checked while parsing it.

Frames are decoded one at a time with the plugin chosen for the transfer syntax, after the frame's
codestream header has been checked against the DICOM header (:mod:`appliance.dicom.codestream`).
:meth:`DicomInstance.decode_frame` touches only values copied out at parse time, so many threads may call it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from pydicom.dataset import Dataset
from pydicom.encaps import encapsulate, generate_frames, get_frame
from pydicom.pixels import get_decoder
from pydicom.uid import JPEG2000, ExplicitVRBigEndian, JPEG2000Lossless, RLELossless

from appliance.dicom.codestream import FrameGeometry, StreamError, check_frame, j2k_reversible_levels, stream_kind
from appliance.dicom.jpegcheck import jpeg_data_lost, lossless_data_lost
from appliance.dicom.openjpeg import decode_j2k_grey, decode_j2k_lowpass
from appliance.dicom.rlecheck import rle_first_segment, rle_segments_swapped, rle_size_problem
from appliance.dicom.syntaxes import MODALITIES, NATIVE, defined_term, first_line, tag_name, ts_label
from appliance.errors import DicomError

__all__ = ["DicomInstance", "DicomLimits"]


@dataclass(frozen=True)
class DicomLimits:
    """Bounds checked before anything is allocated for an input."""

    max_bytes: int = 64 << 20  # encoded size of the whole Part 10 file
    max_pixels_per_frame: int = 4096 * 4096  # Rows x Columns
    max_frames: int = 512  # Number of Frames
    max_decoded_bytes: int = 1 << 30  # all frames, all samples, at the decoded item size
    max_inflated_bytes: int = 256 << 20  # a deflated dataset, inflated (counted in chunks, never held)
    max_items: int = 100_000  # sequence items (and pixel fragments) in the dataset: a parse-time bomb bound
    max_elements: int = 250_000  # data elements read, every level: 4 million empty ones (53 KB deflated) took 10 s
    # Compressed pixel data may decode to at most this many times its encoded size, once it decodes to more than
    # decode_ratio_floor_bytes: a few KB of constant 4096 x 4096 JPEG 2000 frames decode to 1 GiB within every
    # other limit and hold a worker for 17 s (docs/robustness.md).
    max_decode_ratio: int = 1000
    decode_ratio_floor_bytes: int = 64 << 20


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
    _frames: list[bytes] = field(default_factory=list, repr=False)  # every frame, once found at once (no table)

    def __repr__(self) -> str:
        """Return shape, syntax and UIDs only; never patient data."""
        return (
            f"DicomInstance(sop_instance_uid={self.sop_instance_uid!r}, sop_class={self.sop_class_uid!r}, "
            f"ts={self.transfer_syntax_uid!r}, modality={defined_term(self.modality, MODALITIES)}, "
            f"frames={self.number_of_frames}, "
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
        if self._unaligned_bits():
            return self._bit_frame(index), self.photometric
        frame = self._check_stream(index)
        if frame is not None and (grey := self._plain_j2k_grey(frame)) is not None:
            return grey, self.photometric
        if frame is not None and stream_kind(self.transfer_syntax_uid) == "jpeg" and self.bits_stored <= 8:
            lost = jpeg_data_lost(frame, self.samples_per_pixel)  # the decoders below would fill it in silently
            if lost is not None:
                raise DicomError(f"{tag_name('PixelData')} frame {index} ({ts_label(self.transfer_syntax_uid)}): "
                                 f"the JPEG data is truncated or corrupt (libjpeg-turbo: {lost[:120]})",
                                 field="dicom.PixelData")
        decoder = get_decoder(self.transfer_syntax_uid)
        plugin = "" if self.decoding_plugin == NATIVE else self.decoding_plugin
        src, at, opts = self._decoder_source(frame, index)
        try:
            arr, props = decoder.as_array(src, index=at, validate=True, raw=raw, decoding_plugin=plugin, **opts)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException as e:  # noqa: BLE001 - a Rust panic (pyo3 PanicException) is a BaseException too
            if frame is not None and self.transfer_syntax_uid == RLELossless:
                self._explain_rle(index, frame)
            raise self._decode_failed(index, f"using plugin {self.decoding_plugin!r}", e) from e
        if arr.shape != self.frame_shape:
            raise DicomError(
                f"{tag_name('PixelData')} frame {index} decoded to shape {arr.shape}, header says "
                f"{self.frame_shape} (transfer syntax {ts_label(self.transfer_syntax_uid)}, "
                f"plugin {self.decoding_plugin!r})",
                field="dicom.PixelData",
            )
        if frame is not None:
            self._check_range(index, arr)
            if stream_kind(self.transfer_syntax_uid) == "jpeg":
                self._check_lossless(index, frame, arr)
            elif self.transfer_syntax_uid == RLELossless:
                high, problem = rle_first_segment(frame, self._rle_segment_bytes())
                if problem is not None:
                    raise self._rle_size_error(index, problem)
                if (self.samples_per_pixel == 1 and self.bits_allocated == 16 and high is not None
                        and rle_segments_swapped(frame, self.rows * self.columns, self.bits_stored,
                                                 bool(self.pixel_representation), high)):
                    raise DicomError(f"{tag_name('PixelData')} frame {index} (RLE Lossless): the segments are in the "
                                     "wrong order (the low bytes come first; PS3.5 G.2 puts the high bytes first), so "
                                     "every value would be byte-swapped", field="dicom.PixelData")
        return arr, str(props.get("photometric_interpretation", self.photometric))

    def _check_lossless(self, index: int, frame: bytes, arr: np.ndarray) -> None:
        """Refuse a lossless JPEG frame whose decoded samples need more bits than its data holds (lost data)."""
        lost = lossless_data_lost(frame, arr, self.bits_stored)
        if lost is not None:
            raise DicomError(f"{tag_name('PixelData')} frame {index} ({ts_label(self.transfer_syntax_uid)}): the "
                             f"JPEG data is truncated or corrupt: {lost}", field="dicom.PixelData")

    def _check_range(self, index: int, arr: np.ndarray) -> None:
        """Refuse a decoded compressed frame whose values do not fit (0028,0101) Bits Stored and its sign.

        Native and RLE samples are masked to Bits Stored; a JPEG-family codestream whose own precision or sign
        disagrees with the header would otherwise reach the model unmasked (a 16-bit stream under Bits Stored 12
        decoded to 65,024 where the native file gives 3,584). Which one is right cannot be known: refused.
        """
        if arr.dtype.kind not in "iu" or self.bits_stored >= arr.dtype.itemsize * 8:
            return
        lo, hi = ((-(1 << (self.bits_stored - 1)), (1 << (self.bits_stored - 1)) - 1) if self.pixel_representation
                  else (0, (1 << self.bits_stored) - 1))
        got_lo, got_hi = int(arr.min()), int(arr.max())
        if got_lo < lo or got_hi > hi:
            raise DicomError(
                f"{tag_name('PixelData')} frame {index} ({ts_label(self.transfer_syntax_uid)}) decodes to values "
                f"{got_lo} .. {got_hi}, outside the {lo} .. {hi} that {tag_name('BitsStored')} = {self.bits_stored} "
                f"and {tag_name('PixelRepresentation')} = {self.pixel_representation} allow: the codestream's "
                "precision or sign disagrees with the header",
                field="dicom.BitsStored",
            )

    def _plain_j2k_grey(self, frame: bytes) -> np.ndarray | None:
        """``frame`` decoded by Pillow's OpenJPEG (which can use idle cores), or None to decode it with pydicom.

        Only a plain reversible greyscale JPEG 2000 frame of 16-bit samples takes this path: its stored values
        are exact integers, so Pillow and pylibjpeg-openjpeg agree on every one (docs/dicom.md, "JPEG 2000 on idle
        cores"). Anything Pillow fails on goes to pydicom's plugin, which gives the verdict and the error.
        """
        if not self._plain_j2k_candidate() or self.bits_allocated != 16:
            return None
        signed = bool(self.pixel_representation)
        if not j2k_reversible_levels(frame, self.bits_stored, signed):
            return None
        try:
            arr = decode_j2k_grey(frame, self.bits_stored, signed)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException:  # noqa: BLE001 - pylibjpeg decodes it next and names the problem
            return None
        if arr.shape != (self.rows, self.columns):
            return None
        return arr.astype(np.int16 if signed else np.uint16)

    def _plain_j2k_candidate(self) -> bool:
        return (self.transfer_syntax_uid in (JPEG2000Lossless, JPEG2000) and self.samples_per_pixel == 1
                and self.pixel_keyword == "PixelData")

    def decode_frame_lowpass(self, index: int) -> np.ndarray | None:
        """Return frame ``index``'s 5/3 level-1 low-pass band as int32 stored values, or None where there is none.

        Only a plain reversible JPEG 2000 greyscale frame (:func:`~appliance.dicom.codestream.j2k_reversible_levels`)
        whose samples agree with Bits Stored and Pixel Representation has one; for everything else the caller
        decodes in full with :meth:`decode_frame_raw`. The band is ``ceil(rows / 2)`` x ``ceil(columns / 2)``.

        Raises:
            IndexError: ``index`` is out of range.
            DicomError: the frame's codestream is malformed or the decoder failed on it.
        """
        if not 0 <= index < self.number_of_frames:
            raise IndexError(f"frame index {index} out of range for {self.number_of_frames} frame(s)")
        if not self._plain_j2k_candidate():
            return None
        frame = self._check_stream(index)
        if frame is None or not j2k_reversible_levels(frame, self.bits_stored, bool(self.pixel_representation)):
            return None
        try:
            arr = decode_j2k_lowpass(frame, self.bits_stored, bool(self.pixel_representation))
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException as e:  # noqa: BLE001 - any decoder failure is this frame's fault
            raise self._decode_failed(index, "at half resolution (Pillow)", e) from e
        if arr.shape != (-(-self.rows // 2), -(-self.columns // 2)):
            raise DicomError(
                f"{tag_name('PixelData')} frame {index} decoded at half resolution to shape {arr.shape}, the "
                f"header's {self.rows} x {self.columns} halves to {-(-self.rows // 2)} x {-(-self.columns // 2)}",
                field="dicom.PixelData",
            )
        return arr

    def _rle_segment_bytes(self) -> int:
        """Bytes each RLE segment of a frame decodes to: one per pixel (1-bit frames: packed, PS3.5 G.2)."""
        pixels = self.rows * self.columns
        return pixels if self.bits_allocated >= 8 else -(-pixels // 8)

    def _explain_rle(self, index: int, frame: bytes) -> None:
        """Raise the client error naming the RLE segment whose size is wrong, if one is (docs/dicom.md, "RLE")."""
        problem = rle_size_problem(frame, self._rle_segment_bytes())
        if problem is not None:
            raise self._rle_size_error(index, problem)

    def _rle_size_error(self, index: int, problem: str) -> DicomError:
        return DicomError(
            f"{tag_name('PixelData')} frame {index} ({ts_label(self.transfer_syntax_uid)}, {tag_name('Rows')} x "
            f"{tag_name('Columns')} = {self.rows} x {self.columns}): {problem}",
            field="dicom.PixelData",
        )

    def _decode_failed(self, index: int, how: str, error: BaseException) -> DicomError:
        """The client error for a decoder that failed on frame ``index`` (``how``: which decoder, which way)."""
        return DicomError(
            f"cannot decode frame {index} of {tag_name('PixelData')} with transfer syntax "
            f"{ts_label(self.transfer_syntax_uid)} {how}: {type(error).__name__}: {first_line(error)}",
            field="dicom.PixelData",
        )

    def _unaligned_bits(self) -> bool:
        """1-bit native frames that do not end on a byte boundary (pydicom decodes them only all at once)."""
        return (self.decoding_plugin == NATIVE and self.bits_allocated == 1 and self.number_of_frames > 1
                and (self.rows * self.columns) % 8 != 0)

    def _bit_frame(self, index: int) -> np.ndarray:
        """Frame ``index`` of 1-bit native pixel data whose frames share bytes: the bits, unpacked in place.

        DICOM packs 1-bit pixels continuously across frames, least significant bit first (PS3.5 8.1.1), so frame
        i is bits [i n, (i + 1) n) of the value for n pixels a frame.
        """
        if self.transfer_syntax_uid == ExplicitVRBigEndian:  # OW words swapped: the bit order differs
            raise DicomError(
                f"{tag_name('BitsAllocated')} = 1 frames of {self.rows} x {self.columns} pixels do not end on a "
                f"byte boundary; in Explicit VR Big Endian that layout is not supported",
                field="dicom.PixelData",
            )
        n = self.rows * self.columns
        first = index * n
        start, shift = divmod(first, 8)
        chunk = np.frombuffer(self._pixels, dtype=np.uint8, count=(shift + n + 7) // 8, offset=start)
        bits = np.unpackbits(chunk, bitorder="little")[shift: shift + n]
        return bits.reshape(self.rows, self.columns)

    def _encoded_frame(self, encapsulated: bytes, index: int) -> bytes:
        """Frame ``index``'s encoded bytes.

        Without an offset table pydicom finds a frame by reading every fragment before it, and every call starts
        again from the first: 64 frames of 1,500 fragments each took 39-46 s (held-out review, session 20). Then all
        the frames are found in one pass, the first time one is asked for, and kept (their bytes are the file's).
        """
        tables = bool(self._opts.get("extended_offsets")) or encapsulated[4:8] != b"\0\0\0\0"  # a Basic Offset Table
        if self.number_of_frames == 1 or tables:
            return get_frame(encapsulated, index, number_of_frames=self.number_of_frames,
                             extended_offsets=self._opts.get("extended_offsets"))
        if not self._frames:
            found = generate_frames(encapsulated, number_of_frames=self.number_of_frames)
            # built whole, then set in one step: a thread decoding another frame never sees half the list
            self._frames[:] = list(itertools.islice(found, self.number_of_frames))
        if index >= len(self._frames):
            raise ValueError(f"There is insufficient pixel data to contain {index + 1} frames")
        return self._frames[index]

    def _decoder_source(self, frame: bytes | None, index: int) -> tuple[bytes | memoryview, int, dict[str, Any]]:
        """What pydicom's decoder gets: the source, the frame's index in it, the options.

        Of several frames, the one :meth:`_check_stream` found, alone (pydicom would look for it again among the
        fragments); else the pixel data as held (one frame: pydicom finds it at once, and a copy would cost more).
        """
        if frame is None or self.number_of_frames == 1:
            return self._pixels, index, self._opts
        return encapsulate([frame]), 0, {**self._opts, "number_of_frames": 1, "extended_offsets": None}

    def _check_stream(self, index: int) -> bytes | None:
        """Check frame ``index``'s codestream header against the DICOM header before any decoder runs.

        Returns the frame's bytes (None for native pixel data).
        """
        if stream_kind(self.transfer_syntax_uid) is None:
            return None
        try:
            encapsulated = cast(bytes, self._pixels)  # only native pixel data is held as a memoryview
            frame = self._encoded_frame(encapsulated, index)
            check_frame(self.transfer_syntax_uid, frame, FrameGeometry(
                self.rows, self.columns, self.samples_per_pixel, self.bits_allocated, self.bits_stored,
                self.pixel_representation))
            return frame
        except StreamError as e:
            raise DicomError(
                f"{tag_name('PixelData')} frame {index} ({ts_label(self.transfer_syntax_uid)}): {e}",
                field="dicom.PixelData",
            ) from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - malformed fragments
            raise DicomError(
                f"cannot locate frame {index} in {tag_name('PixelData')}: {type(e).__name__}: {first_line(e)}",
                field="dicom.PixelData",
            ) from None
