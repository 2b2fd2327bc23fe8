"""Keep glibc's malloc from handing every request's buffers back to the kernel (docs/performance.md, "Heap").

With glibc's defaults a buffer over 128 KiB starts as its own ``mmap`` and a free heap top over 128 KiB is
trimmed, so each request's DICOM bytes, pixel arrays and float32 planes (0.5-2 MiB each for a 512x512 CT slice)
come back as fresh pages: about 600 minor page faults per slice in a worker, 2.4 ms of CPU on top of 1.5 ms of
real work for an uncompressed slice. :func:`keep_heap` raises both thresholds so freed memory is reused: the
process keeps up to ``keep_bytes`` of free heap instead. Where libc is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD_MAX", "keep_heap"]

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's own cap for its dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except (OSError, TypeError):
        return None
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):  # musl's mallopt is a no-op
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def keep_heap(keep_bytes: int, *, libc: ctypes.CDLL | None = None) -> bool:
    """Let this process reuse up to ``keep_bytes`` of freed heap instead of returning it (0: glibc defaults).

    Sets ``M_MMAP_THRESHOLD`` to ``min(keep_bytes, 32 MiB)`` (larger blocks still get their own mapping and go
    back to the kernel when freed) and ``M_TRIM_THRESHOLD`` to ``keep_bytes``. Returns True when both were set.

    Args:
        keep_bytes: free heap the process may keep; 0 leaves malloc as it is.
        libc: the C library to call (tests pass a fake); default: this process's glibc, if it is glibc.
    """
    if keep_bytes <= 0:
        return False
    libc = libc or _glibc()
    if libc is None:
        log.info("heap: workers.heap_keep_bytes has no effect here (libc is not glibc); malloc left as it is")
        return False
    mmap_threshold = min(int(keep_bytes), MMAP_THRESHOLD_MAX)
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(libc.mallopt(M_TRIM_THRESHOLD, int(keep_bytes)))
    if not ok:
        log.warning("heap: mallopt refused the thresholds (mmap %d, trim %d bytes)", mmap_threshold, keep_bytes)
    return ok
