"""What the header says a frame's stored values mean: rescale, window, modality LUT and pixel spacing, per frame.

Read from an enhanced image's functional groups before any top-level copy, each value checked and every rejection
naming the tag (docs/dicom.md). Split from :mod:`appliance.dicom.pixels`, which reads the pixel module and the
pixel data's layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydicom.dataset import Dataset
from pydicom.pixels.processing import apply_modality_lut

from appliance.dicom.pixels import PixelModule
from appliance.dicom.syntaxes import tag_name
from appliance.errors import DicomError

__all__ = ["check_functional_groups", "modality_lut_table", "per_frame", "pixel_spacing", "rescale_for",
           "rescale_given", "window_for"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)  # the pipelines compute in float32

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


def check_functional_groups(ds: Dataset, pm: PixelModule) -> None:
    """Refuse per-frame functional groups that do not cover every frame the same way (held-out review, session 14).

    With one item for two frames, or a rescale for some frames only, the rest fell back to slope 1 / intercept 0
    and stored values were windowed as if they were Hounsfield units: wrong pixels, answered OK.
    """
    seq = ds.get("PerFrameFunctionalGroupsSequence")
    if seq and len(seq) < pm.frames:  # more items than frames happens (pydicom's liver_1frame.dcm) and is harmless
        raise DicomError(
            f"{tag_name('PerFrameFunctionalGroupsSequence')} has {len(seq)} item(s) for {tag_name('NumberOfFrames')}"
            f" = {pm.frames}: it needs one item per frame",
            field="dicom.PerFrameFunctionalGroupsSequence",
        )
    given = [_functional_item(ds, i, "PixelValueTransformationSequence") is not None for i in range(pm.frames)]
    if any(given) and not all(given):
        raise DicomError(
            f"{tag_name('PixelValueTransformationSequence')} is given for frame {given.index(True)} but not for "
            f"frame {given.index(False)}: every frame needs its own or a shared one",
            field="dicom.PixelValueTransformationSequence",
        )


def rescale_for(ds: Dataset, index: int) -> tuple[float, float]:
    """Return (slope, intercept) for frame ``index``: its functional group, else top level, else (1, 0).

    An enhanced multi-frame object carries them per frame (or shared); a top-level copy next to them is a leftover
    that the standard does not allow there, and it would give every frame the same values.
    """
    src = _rescale_source(ds, index)
    if "RescaleSlope" not in src and "RescaleIntercept" not in src:
        return 1.0, 0.0
    for keyword in ("RescaleSlope", "RescaleIntercept"):
        if keyword in src and src[keyword].VR != "DS":
            # a decimal string (PS3.6); US 64512 was read as +64512 where the writer meant -1024 (session 20 review)
            raise DicomError(f"{tag_name(keyword)} must be a decimal string (VR DS), not {src[keyword].VR}",
                             field=f"dicom.{keyword}")
        value = src.get(keyword)
        if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) > 1:
            # VM 1: taking the first of "-1024\\0" would be a guess at what the writer meant
            raise DicomError(f"{tag_name(keyword)} has {len(value)} values; it takes exactly one",
                             field=f"dicom.{keyword}")
    slope = _float_or_none(src.get("RescaleSlope", 1.0))
    intercept = _float_or_none(src.get("RescaleIntercept", 0.0))
    if slope is None or slope == 0.0 or abs(slope) > _FLOAT32_MAX:
        raise DicomError(f"{tag_name('RescaleSlope')} must be a finite non-zero float32 number",
                         field="dicom.RescaleSlope")
    if intercept is None or abs(intercept) > _FLOAT32_MAX:
        raise DicomError(f"{tag_name('RescaleIntercept')} must be a finite float32 number",
                         field="dicom.RescaleIntercept")
    return slope, intercept


def rescale_given(ds: Dataset, index: int) -> bool:
    """Whether frame ``index``'s rescale (its functional group's item, else the top level) has a Rescale Intercept.

    The item is what :func:`rescale_for` reads: an item without the intercept (type 1 there) was taken as giving
    one, and its frames were read with intercept 0, every value 1024 HU too high (held-out review, session 19).
    """
    return "RescaleIntercept" in _rescale_source(ds, index)


def _rescale_source(ds: Dataset, index: int) -> Dataset:
    """Where frame ``index``'s rescale is read: its Pixel Value Transformation item, else the top level.

    A top-level copy beside the functional groups is a leftover the standard does not allow there.
    """
    item = _functional_item(ds, index, "PixelValueTransformationSequence")
    return item if item is not None else ds


def window_for(ds: Dataset, index: int) -> tuple[float, float] | None:
    """Return the first usable (center, width) VOI window for frame ``index`` (its functional group first), or None."""
    src = _functional_item(ds, index, "FrameVOILUTSequence")
    if src is None and "WindowWidth" in ds:
        src = ds
    if src is None:
        return None
    center = _float_or_none(src.get("WindowCenter"))
    width = _float_or_none(src.get("WindowWidth"))
    if center is None or width is None or width < 1:
        return None
    return center, width


def per_frame(values: list[Any]) -> tuple[Any, ...]:
    """Collapse per-frame values to one when they are all equal."""
    return (values[0],) if all(v == values[0] for v in values) else tuple(values)


def modality_lut_table(ds: Dataset, pm: PixelModule) -> tuple[int, np.ndarray] | None:
    """Return the Modality LUT Sequence as (first stored value mapped, float32 table), or None."""
    seq = ds.get("ModalityLUTSequence")
    if not seq:
        return None
    item = _functional_item(ds, 0, "PixelValueTransformationSequence")
    rescale = item if item is not None else ds
    if "RescaleSlope" in rescale or "RescaleIntercept" in rescale:
        # PS3.3 C.11.1: a Modality LUT Sequence or a rescale, never both; each maps stored values differently and
        # which one the writer meant cannot be known (docs/dicom.md)
        raise DicomError(f"{tag_name('ModalityLUTSequence')} and {tag_name('RescaleSlope')} / "
                         f"{tag_name('RescaleIntercept')} are both present: the standard allows one or the other, "
                         "and they map stored values differently: contradictory", field="dicom.ModalityLUTSequence")
    _check_lut_item(seq[0])
    try:
        n_entries, read, _bits = (int(v) for v in seq[0].LUTDescriptor)
        n_entries = n_entries or 65536
        # pydicom indexes LUT Data with the first mapped value as it reads it (as US, 0xF800 for -2048): ask it for
        # the entries in index order with that same value, then map them from the signed one
        table = np.asarray(apply_modality_lut(np.arange(read, read + n_entries, dtype=np.int64), ds),
                           dtype=np.float32)
        first = read - (1 << 16) if pm.pixel_representation == 1 and read >= 1 << 15 else read
    except OverflowError as e:  # pydicom holds 8-bit entries in uint8: wider values in the data do not fit
        raise DicomError(f"{tag_name('ModalityLUTSequence')}: {tag_name('LUTData')} holds values wider than the bits "
                         f"per entry its {tag_name('LUTDescriptor')} gives", field="dicom.ModalityLUTSequence") from e
    except Exception as e:  # noqa: BLE001 - malformed LUT descriptor or data
        raise DicomError(f"{tag_name('ModalityLUTSequence')} is malformed: {type(e).__name__}",
                         field="dicom.ModalityLUTSequence") from e
    if table.shape != (n_entries,):
        raise DicomError(f"{tag_name('ModalityLUTSequence')} LUT Data does not match its LUT Descriptor",
                         field="dicom.ModalityLUTSequence")
    return first, table


def _check_lut_item(item: Dataset) -> None:
    """Name what is wrong with a Modality LUT item before pydicom applies it (its errors name no element)."""
    where = tag_name("ModalityLUTSequence")
    descriptor = item.get("LUTDescriptor")
    values = list(descriptor) if isinstance(descriptor, Sequence) and not isinstance(descriptor, str | bytes) else []
    if len(values) != 3 or not all(isinstance(v, int) for v in values):
        raise DicomError(f"{where}: {tag_name('LUTDescriptor')} must hold 3 integers (entries, first stored value "
                         "mapped, bits per entry)", field="dicom.ModalityLUTSequence")
    entries, _first, bits = values
    if not 1 <= bits <= 16:
        raise DicomError(f"{where}: {tag_name('LUTDescriptor')} gives {bits} bits per entry; at most 16 are allowed",
                         field="dicom.ModalityLUTSequence")
    data = item.get("LUTData")
    if data is None or isinstance(data, bytes | str) and not data:
        raise DicomError(f"{where}: {tag_name('LUTData')} is missing or empty", field="dicom.ModalityLUTSequence")
    # 8-bit entries may be packed two to a word, so only wider ones are counted here (2 bytes each when read as OW)
    if bits > 8 and isinstance(data, bytes | Sequence) and not isinstance(data, str):
        count = len(data) // 2 if isinstance(data, bytes) else len(data)
        if count != (entries or 65536):
            raise DicomError(f"{where}: {tag_name('LUTData')} holds {count} entries, but "
                             f"{tag_name('LUTDescriptor')} says {entries or 65536}", field="dicom.ModalityLUTSequence")


def pixel_spacing(ds: Dataset) -> tuple[float, float] | None:
    """Return (row, column) spacing in mm when present, finite and positive, else None."""
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
