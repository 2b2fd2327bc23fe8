"""What a damaged file looks like once pydicom has read it (docs/dicom.md).

Cut inside an element, a length that lies, an element written twice: pydicom reads all three without a word (a value
cut short, the made-up tag a lying length ends on, the last of two copies). The reader asks here before it accesses
any element (an accessed element is converted, and its declared length is gone); :mod:`appliance.dicom.repeats` is
what notes the repeats while pydicom reads.
"""

from __future__ import annotations

import struct

from pydicom.datadict import keyword_for_tag, tag_for_keyword
from pydicom.dataset import Dataset

from appliance.dicom import repeats
from appliance.dicom.pixels import PIXEL_KEYWORDS
from appliance.dicom.syntaxes import tag_label, tag_name

__all__ = ["cut_short", "duplicated", "repeated_message", "unclosed"]

_PIXEL_TAGS = frozenset(tag_for_keyword(keyword) for keyword in PIXEL_KEYWORDS)
#: (7FE0,0010) Pixel Data, encapsulated: explicit VR little endian, undefined length (every compressed syntax); OB
#: as PS3.5 says, or OW as some writers have it (pydicom-data's emri_small_jpeg_2k_lossless)
_ENCAPSULATED = tuple(b"\xe0\x7f\x10\x00" + vr + b"\x00\x00\xff\xff\xff\xff" for vr in (b"OB", b"OW"))

#: The sequences whose items the pipelines read (the modality LUT; an enhanced image's functional groups and the
#: macros inside them): a repeat inside their items is refused like one at the top level.
_ITEM_CHECKED = ("ModalityLUTSequence", "SharedFunctionalGroupsSequence", "PerFrameFunctionalGroupsSequence",
                 "PixelValueTransformationSequence", "FrameVOILUTSequence", "PixelMeasuresSequence")


def cut_short(ds: Dataset) -> str | None:
    """Say so when the dataset's last element holds fewer bytes than its length says: the file was cut inside it.

    pydicom reads such a value short without complaint; a file cut inside (0008,0016) SOP Class UID then looked
    like a non-image SOP class (FAILED_PRECONDITION, "do not retry") rather than a damaged file (docs/dicom.md).
    When that last element cannot be one, the file was not cut: the length of the element before it lies.
    """
    tags = list(ds.keys())
    if not tags or tags[-1] in _PIXEL_TAGS:  # pixel data is judged by the bytes the image needs
        return None
    last = tags[-1]
    raw = ds.get_item(last)
    length = getattr(raw, "length", None)
    value = getattr(raw, "value", None)
    if isinstance(length, int) and length != 0xFFFFFFFF and isinstance(value, bytes) and len(value) < length:
        before = ds.get_item(tags[-2]) if len(tags) > 1 else None
        if before is not None and (why := _not_an_element(ds, int(last), int(tags[-2]))):
            # a length that lies swallows the elements after it, and the bytes where it ends read as a made-up tag
            # that runs past the end: naming that tag sent the reader looking for an element not in the file
            liar = tag_label(int(tags[-2]))
            return (f"{liar} declares {getattr(before, 'length', '?')} bytes, and what follows it does not read as an "
                    f"element ({tag_label(int(last))}: {why}, {length} bytes long, {len(value)} there): the length "
                    f"of {liar} is probably wrong")
        return f"the file ends inside {tag_label(int(last))}: {len(value)} of its {length} bytes are there (truncated)"
    return None


def unclosed(data: bytes, at: int | None, *, big: bool = False) -> tuple[str, str]:
    """Say why pydicom read no element at all of a file whose data set has bytes: (message, field).

    pydicom reads an element of undefined length up to its delimiter; when the file ends first it warns and keeps
    nothing of the data set, not even the elements before it. The commonest case is a compressed file cut short: its
    encapsulated Pixel Data's fragments are never closed by the (FFFE,E0DD) Sequence Delimitation Item (a held-out
    corpus, session 24: "no data elements after the file meta information" for 40 KB of elements). ``at`` is where
    the element pydicom could not finish begins (:func:`appliance.dicom.repeats.top_stopped_at`), so the element is
    named from its own tag; ``big`` for Explicit VR Big Endian.
    """
    if at is None or at + 4 > len(data):
        return ("the file ends inside an element of undefined length, before its delimiter (truncated): pydicom "
                "could read none of the data set", "dicom")
    group, element = struct.unpack_from(">HH" if big else "<HH", data, at)
    tag = group << 16 | element
    if tag == 0x7FE00010 and data[at:at + 12] in _ENCAPSULATED:
        return (f"the file ends inside {tag_label(tag)}: its encapsulated fragments ({len(data) - at - 12} bytes) are "
                "not closed by the (FFFE,E0DD) Sequence Delimitation Item (truncated)", "dicom.PixelData")
    return (f"the file ends inside {tag_label(tag)}, a value of undefined length, before its delimiter (truncated): "
            "pydicom could read none of the data set", "dicom")


def _not_an_element(ds: Dataset, tag: int, before: int) -> str:
    """Why ``tag``, read after ``before``, cannot be an element of ``ds`` ("" when it can)."""
    group, element = tag >> 16, tag & 0xFFFF
    if tag <= before:
        return "out of order: the elements of a data set come in ascending tag order"
    if group & 1:  # private: (gggg,xxyy) needs its creator (gggg,00xx) in the same data set
        if element == 0 or 0x0010 <= element <= 0x00FF:  # a group length, or a private creator
            return ""
        if element < 0x1000:
            return "not a private element number"
        return "" if (tag & 0xFFFF0000 | element >> 8) in ds else "a private tag without its private creator"
    if element and not keyword_for_tag(tag):
        return "not in the DICOM dictionary"
    return ""


def repeated_message(tag: int, where: str) -> str:
    """The refusal of an element that appears twice; ``where`` says where (" in item 1 of ...", or "")."""
    return f"{tag_label(tag)} appears more than once{where}: which value the writer meant cannot be known"


def duplicated(ds: Dataset) -> str | None:
    """Say so when an element appears twice in the dataset or an item the pipelines read: pydicom keeps the last value.

    A second (0028,1052) Rescale Intercept after the pixel data silently replaced the real one (docs/dicom.md);
    inside a functional group's Pixel Value Transformation item it did the same, and so did two copies side by side,
    which the earlier test of the elements' file positions missed (session 20).
    """
    if again := repeats.top_repeated():
        return repeated_message(again[0], "")
    return _duplicated_in_items(ds, "")


def _duplicated_in_items(ds: Dataset, where: str) -> str | None:
    for keyword in _ITEM_CHECKED:
        if keyword not in ds:
            continue
        try:
            items = list(ds[keyword].value)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException:  # noqa: BLE001 - a malformed sequence is refused where it is read, with its own words
            continue
        for k, item in enumerate(items):
            if not isinstance(item, Dataset):
                continue
            inner = f" in item {k + 1} of {tag_name(keyword)}{where}"
            if again := repeats.repeated(item):
                return repeated_message(again[0], inner)
            if (found := _duplicated_in_items(item, inner)) is not None:
                return found
    return None
