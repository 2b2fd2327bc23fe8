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
import threading
import warnings
import zlib

import numpy as np
import pydicom
from pydicom import uid as _uid
from pydicom.datadict import dictionary_has_tag, dictionary_VR, keyword_for_tag
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.filereader import _read_file_meta_info, read_preamble

from appliance.dicom import damage, repeats
from appliance.dicom.instance import DicomInstance, DicomLimits
from appliance.dicom.pixels import (
    PIXEL_KEYWORDS,
    check_decode_ratio,
    check_limits,
    decode_options,
    encapsulated_pixels,
    native_pixels,
    pixel_module,
)
from appliance.dicom.syntaxes import (
    DECODER_PLUGINS,
    LOSSY_SYNTAXES,
    check_syntax,
    first_line,
    tag_label,
    tag_name,
    uid_label,
)
from appliance.dicom.values import (
    check_functional_groups,
    modality_lut_table,
    per_frame,
    pixel_spacing,
    rescale_for,
    window_for,
)
from appliance.errors import DicomError, LimitExceeded, NotApplicable

__all__ = ["parse"]

logger = logging.getLogger(__name__)

# SOP classes that carry pixel data although their names do not say "Image".
_PIXEL_CLASS_WORDS = ("Image", "Segmentation", "RT Dose", "Parametric Map")
_PARSE_LOCK = threading.Lock()
repeats.install()  # the reader notes every element a data set holds twice (docs/dicom.md, "Repeated elements")
_ITEM_TAG = b"\xfe\xff\x00\xe0"  # (FFFE,E000) Item, little endian
_ITEM_TAG_BE = b"\xff\xfe\xe0\x00"  # the same, big endian
_COUNT_CHUNK = 1 << 20


def count_tag(data: bytes, tag: bytes) -> int:
    """Count the occurrences of a 4-byte tag pattern in ``data`` (a tag's bytes cannot overlap themselves).

    Vectorised, 1 MiB at a time: ``bytes.count`` takes ~0.38 ms on a 512 KiB CT slice, a fifth of its whole
    bytes-to-slot cost; this takes ~0.08 ms, and never holds more than one chunk's candidate indices.
    """
    a = np.frombuffer(data, dtype=np.uint8)
    b0, b1, b2, b3 = tag
    end = a.size - 3
    total = 0
    for start in range(0, max(end, 0), _COUNT_CHUNK):
        idx = np.flatnonzero(a[start:min(start + _COUNT_CHUNK, end)] == b0)
        if idx.size:
            idx += start
            total += int(np.count_nonzero((a[idx + 1] == b1) & (a[idx + 2] == b2) & (a[idx + 3] == b3)))
    return total

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
        raise DicomError(f"not a DICOM Part 10 file: {_no_prefix(data)}")
    with _PARSE_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inst = _build(_read(data, limits), limits)
    if caught:
        # Only the count and categories: pydicom's warning texts can quote element values (patient data).
        logger.debug("pydicom emitted %d warning(s) while parsing: %s", len(caught),
                     sorted({w.category.__name__ for w in caught}))
    return inst


def _no_prefix(data: bytes) -> str:
    """What a file without the Part 10 header has instead (a writer that left out the preamble, or a bare dataset)."""
    if data.startswith(b"DICM"):
        return "it starts with the 'DICM' prefix but without the 128-byte preamble before it (PS3.10 7.1)"
    if data.startswith(b"\x02\x00") and data[4:6].isalpha() and data[4:6].isupper():  # (0002,eeee) and a VR:
        # file meta information, explicit VR little endian as PS3.10 requires
        return ("it starts with its file meta information (group 0002) but without the 128-byte preamble and "
                "'DICM' prefix before it (PS3.10 7.1)")
    if data.startswith(b"\x08\x00"):  # (0008,eeee), little endian: a data set's first group
        return ("it starts with a data set, without the 128-byte preamble, 'DICM' prefix and file meta information "
                "(PS3.10 7.1) that name its transfer syntax")
    return "no 'DICM' prefix after the 128-byte preamble (the preamble, prefix and file meta information are required)"


def _read(data: bytes, limits: DicomLimits) -> Dataset:
    """Read the file meta, check the syntax, then read the dataset (caller holds the lock)."""
    fp = io.BytesIO(data)
    repeats.clear(limits.max_elements)
    try:
        read_preamble(fp, False)
        meta = _read_file_meta_info(fp)
    except LimitExceeded:
        raise
    except Exception as e:  # noqa: BLE001 - any failure here means malformed input
        raise DicomError(f"cannot read the file meta information (group 0002): {type(e).__name__}") from e
    if again := repeats.meta_repeated():  # a second Transfer Syntax UID replaced the first (session 20 review)
        raise DicomError(damage.repeated_message(again[0], " in the file meta information"), field="dicom")
    ts = meta.get("TransferSyntaxUID")
    if not ts:
        raise DicomError(f"{tag_name('TransferSyntaxUID')} is missing from the file meta information",
                         field="dicom.TransferSyntaxUID")
    check_syntax(str(ts))
    if ts == _uid.DeflatedExplicitVRLittleEndian:
        _check_deflate(data[fp.tell():], limits)
    else:
        big = count_tag(data, _ITEM_TAG_BE) if ts == _uid.ExplicitVRBigEndian else 0
        _check_items(count_tag(data, _ITEM_TAG) + big, limits)
    try:
        ds = pydicom.dcmread(io.BytesIO(data), force=False)
    except InvalidDicomError as e:
        raise DicomError(f"not a valid DICOM file: {first_line(e)}") from e
    except (MemoryError, LimitExceeded):
        raise
    except RecursionError:
        raise LimitExceeded("sequences are nested too deeply to parse", field="dicom") from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except (OSError, EOFError) as e:  # pydicom ran out of bytes; its text names a file position, no value
        raise DicomError("cannot parse the DICOM dataset: it ends inside an element, item or sequence (truncated, "
                         f"or a sequence delimiter missing): {first_line(e)}") from e
    except BaseException as e:  # noqa: BLE001 - pydicom raises many types on malformed input
        raise DicomError(f"cannot parse the DICOM dataset: {type(e).__name__}") from e
    if len(ds) == 0 and len(data) > fp.tell():  # an undefined length that never closed: it kept nothing
        raise DicomError(*damage.unclosed(data, repeats.top_stopped_at(), big=ts == _uid.ExplicitVRBigEndian))
    return ds


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
            joined = tail + chunk  # the 3-byte tail alone cannot hold a tag: no tag is counted twice
            items += count_tag(joined, _ITEM_TAG)
            tail = joined[-3:]
    except zlib.error as e:
        raise DicomError(f"deflated dataset does not inflate: {e}") from e
    _check_items(items, limits)


def _is_pixel_class(sop_class: str) -> bool:
    name = _uid.UID(sop_class).name
    return any(word in name for word in _PIXEL_CLASS_WORDS)


def _swapped_hint(ds: Dataset, ts: str) -> str:
    """Name the likely cause when the dataset's tags read byte-swapped: its body is not in the declared syntax."""
    swapped = sum(1 for tag in ds.keys() if tag.group in (0x0800, 0x1000, 0x1800, 0x2000, 0x2800, 0xE07F))
    if swapped and swapped * 2 >= len(ds):
        return (f": the dataset's tags read byte-swapped, so its body is not encoded in the transfer syntax "
                f"{tag_name('TransferSyntaxUID')} declares ({uid_label(ts)})")
    return ""


def _identify(ds: Dataset) -> tuple[str, str, str]:
    """Return (transfer syntax, SOP class, SOP instance) or raise for a non-image / unidentifiable object."""
    ts = str(ds.file_meta.TransferSyntaxUID)
    cut, repeated = damage.cut_short(ds), damage.duplicated(ds)
    if len(ds) == 0:
        raise DicomError("the dataset has no data elements after the file meta information (truncated?)")
    sop_class = ds.get("SOPClassUID")
    if not sop_class:
        media = str(ds.file_meta.get("MediaStorageSOPClassUID", ""))
        if media == _uid.MediaStorageDirectoryStorage:
            raise NotApplicable("a DICOMDIR (Media Storage Directory Storage) is an index, not an image")
        hint = _swapped_hint(ds, ts)
        if cut is not None and not hint:
            raise DicomError(cut, field="dicom")
        raise DicomError(f"{tag_name('SOPClassUID')} is missing{hint}", field="dicom.SOPClassUID")
    sop_class = str(sop_class)
    present = [kw for kw in PIXEL_KEYWORDS if kw in ds]
    if not present:
        if cut is not None:  # a file cut short is damaged, not a non-image object
            raise DicomError(cut, field="dicom")
        label = uid_label(sop_class)
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
    if repeated is not None:
        raise DicomError(repeated, field="dicom")
    return ts, sop_class, str(sop_instance)

#: Bytes a (0028,xxxx) element may hold where pydicom makes an object of every value: decimal or integer strings
#: (a few values each: Pixel Spacing, Window Center) and binary numbers (a LUT's 65,536 entries). 32 elements of
#: 32,767 decimal strings each, 9.6 KB deflated, took 4-7 s and 464 MB to convert (held-out review, session 20).
_MAX_VALUE_BYTES = {"DS": 4096, "IS": 4096, "US": 1 << 18, "SS": 1 << 18, "UL": 1 << 18, "SL": 1 << 18,
                    "FL": 1 << 18, "FD": 1 << 18}


def _convert_pixel_group(ds: Dataset) -> None:
    """Convert the image pixel group (palettes, LUTs) now, under the lock, warnings captured.

    Elements the standard does not define are left as read (nothing reads them), and one longer than
    :data:`_MAX_VALUE_BYTES` allows its VR is refused before pydicom makes an object of each value.
    """
    for tag in [t for t in ds.keys() if t.group == 0x0028]:
        if not dictionary_has_tag(tag):
            continue
        raw = ds.get_item(tag)
        value = getattr(raw, "value", None)
        vr = getattr(raw, "VR", None) or dictionary_VR(tag)  # implicit VR: the dictionary's
        bound = _MAX_VALUE_BYTES.get(vr)
        if bound is not None and isinstance(value, bytes | bytearray) and len(value) > bound:
            raise DicomError(f"{tag_label(int(tag))} holds {len(value)} bytes of {vr} values, more than the {bound} "
                             "any image needs", field=f"dicom.{keyword_for_tag(tag)}")
        try:
            ds[tag]
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException as e:  # noqa: BLE001 - e.g. 3 bytes of US: pydicom's BytesLengthException escaped parse
            raise DicomError(f"{tag_label(int(tag))} cannot be read as {vr}: {type(e).__name__}",
                             field=f"dicom.{keyword_for_tag(tag)}") from None


def _build(ds: Dataset, limits: DicomLimits) -> DicomInstance:
    ts, sop_class, sop_instance = _identify(ds)
    _convert_pixel_group(ds)
    keyword = next(kw for kw in PIXEL_KEYWORDS if kw in ds)
    pm = pixel_module(ds, keyword)
    check_limits(pm, limits)
    raw_pixels = ds[keyword].value
    if not isinstance(raw_pixels, bytes | bytearray):
        raise DicomError(f"{tag_name(keyword)} has no readable value", field=f"dicom.{keyword}")
    raw_pixels = bytes(raw_pixels) if isinstance(raw_pixels, bytearray) else raw_pixels
    if _uid.UID(ts).is_encapsulated:
        check_decode_ratio(pm, len(raw_pixels), limits)
        pixels: bytes | memoryview = encapsulated_pixels(ds, raw_pixels, pm, ts)
    elif ds[keyword].is_undefined_length:  # item headers would be read as pixels, every value shifted (session 20)
        raise DicomError(f"{tag_name(keyword)} is encapsulated (undefined length), but transfer syntax {uid_label(ts)} "
                         "is native (uncompressed)", field=f"dicom.{keyword}")
    else:
        pixels = native_pixels(raw_pixels, pm)
    opts = decode_options(ds, pm, ts)
    modality_lut = modality_lut_table(ds, pm) if pm.samples == 1 and keyword == "PixelData" else None
    check_functional_groups(ds, pm)
    rescale = per_frame([rescale_for(ds, i) for i in range(pm.frames)])
    windows = per_frame([window_for(ds, i) for i in range(pm.frames)])
    lossy = ts in LOSSY_SYNTAXES or str(ds.get("LossyImageCompression", "")).strip() == "01"
    return DicomInstance(
        sop_instance_uid=sop_instance,
        sop_class_uid=sop_class,
        transfer_syntax_uid=ts,
        modality=str(ds.get("Modality") or "").strip(),  # CS: leading and trailing spaces are not significant
        rows=pm.rows,
        columns=pm.columns,
        number_of_frames=pm.frames,
        samples_per_pixel=pm.samples,
        photometric=pm.photometric,
        bits_allocated=pm.bits_allocated,
        bits_stored=pm.bits_stored,
        pixel_representation=pm.pixel_representation,
        pixel_spacing=pixel_spacing(ds),
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
