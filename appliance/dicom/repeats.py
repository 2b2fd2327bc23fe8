"""Which data elements a parse met more than once, per dataset: pydicom keeps only the last copy, silently.

PS3.5 7.1 allows a tag at most once in a data set. pydicom's reader builds each data set as a dict of its elements,
so a second copy replaces the first without a trace (a second (0028,1052) Rescale Intercept turned a nodule's 0.9998
into 0.0054; held-out review, session 20). An earlier check compared the elements' file positions, which catches a
repeat only when another element lies between the copies. This module watches the reader instead: pydicom's
``filereader.read_dataset`` and ``data_element_generator`` are wrapped (:func:`install`, once per process) so each
data set read records the tags its generator yielded twice: :func:`repeated` gives them for a sequence item,
:func:`top_repeated` and :func:`meta_repeated` for the data set and the file meta information of the last parse on
this thread (pydicom copies both into new objects). Sequences of defined length are read when first accessed; their
items are watched then. It also counts the elements a parse reads, all levels, and ends the parse past
``dicom.max_elements``; and it notes where the reading of the top-level data set stopped (:func:`top_stopped_at`:
the element pydicom could not finish). Pure bookkeeping: the values are never read here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from pydicom import filereader
from pydicom.dataset import Dataset

from appliance.errors import LimitExceeded

__all__ = ["clear", "install", "meta_repeated", "repeated", "top_repeated", "top_stopped_at"]

# per thread: .stack, one list of repeated tags per data set being read; .meta and .top, those of the last file meta
# and top-level data set; .tally, [elements read since clear(), max_elements]; .at, one [file offset of the next
# element] per data set being read; .top_stopped, that offset where the last top-level read stopped (-1: none)
_local = threading.local()
_ATTR = "_appliance_repeated"
_installed = False


def _watched_generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
    """Yield what pydicom's element generator yields, noting each tag it yields twice in the data set being read.

    Every element read on this thread since :func:`clear` is counted; past the bound :func:`clear` set, the parse
    ends with :class:`~appliance.errors.LimitExceeded`.
    """
    stack: list[list[int]] = getattr(_local, "stack", [])
    tally: list[int] | None = getattr(_local, "tally", None)  # [elements read, bound], shared by nested reads
    frames: list[list[int]] = getattr(_local, "at", [])
    at = frames[-1] if frames else [0]  # where the data set being read has got to (none: a generator on its own)
    fp = args[0] if args else kwargs["fp"]
    seen: set[int] = set()
    at[0] = fp.tell()
    for element in _ORIGINAL_GENERATOR(*args, **kwargs):
        if tally is not None:
            tally[0] += 1
            if tally[0] > tally[1]:
                raise LimitExceeded(f"the dataset holds more than {tally[1]} data elements, over the limit "
                                    f"max_elements={tally[1]}", field="dicom")
        tag = element.tag  # a BaseTag: an int
        if tag in seen and stack:
            stack[-1].append(int(tag))  # nested items were read (and popped) before the outer generator resumes
        seen.add(tag)
        at[0] = fp.tell()  # the next element starts here
        yield element


def _watched_read_dataset(*args: Any, **kwargs: Any) -> Dataset:
    stack = _local.__dict__.setdefault("stack", [])
    at = _local.__dict__.setdefault("at", [])
    stack.append([])
    at.append([-1])
    try:
        ds = _ORIGINAL_READ_DATASET(*args, **kwargs)
    finally:
        found = stack.pop()
        stopped = at.pop()[0]
    if kwargs.get("stop_when") is not None:  # the file meta: read up to the first element past group 0002
        _local.meta = found
    elif kwargs.get("at_top_level", True):  # the data set itself (pydicom copies it into a FileDataset)
        _local.top = found
        _local.top_stopped = stopped
    elif found:  # a sequence item
        object.__setattr__(ds, _ATTR, tuple(found))
    return ds


_ORIGINAL_GENERATOR = filereader.data_element_generator
_ORIGINAL_READ_DATASET = filereader.read_dataset


def install() -> None:
    """Wrap pydicom's reader (idempotent)."""
    global _installed
    if not _installed:
        filereader.data_element_generator = _watched_generator
        filereader.read_dataset = _watched_read_dataset
        _installed = True


def repeated(item: Dataset) -> tuple[int, ...]:
    """The tags read more than once into a sequence item, in file order of the repeats."""
    return tuple(getattr(item, _ATTR, ()))


def top_repeated() -> tuple[int, ...]:
    """The tags read more than once into the top-level data set by the last read of one on this thread."""
    return tuple(getattr(_local, "top", ()))


def meta_repeated() -> tuple[int, ...]:
    """The tags read more than once into the file meta information by the last read of it on this thread.

    pydicom reads the file meta with a stop condition (the first element past group 0002); the worker never reads a
    data set with one (no ``stop_before_pixels``), so the last such read is the file meta's.
    """
    return tuple(getattr(_local, "meta", ()))


def top_stopped_at() -> int | None:
    """Where, in its file, the last read of a top-level data set on this thread began the element it did not finish.

    At the end of the file when it finished them all. pydicom keeps nothing of a data set whose last element (one of
    undefined length, read up to its delimiter) runs into the end of the file: this is that element
    (:func:`appliance.dicom.damage.unclosed`). None before any read of one.
    """
    stopped = getattr(_local, "top_stopped", -1)
    return None if stopped < 0 else int(stopped)


def clear(max_elements: int | None = None) -> None:
    """Forget the last file's repeats and element count (before reading the next file), and bound the next count."""
    _local.meta = []
    _local.top = []
    _local.top_stopped = -1
    _local.tally = None if max_elements is None else [0, max_elements]
