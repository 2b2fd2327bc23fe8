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

__all__ = ["DAEMON_ARENAS", "DAEMON_MAX_BLOCK", "MMAP_THRESHOLD_MAX", "WORKER_ARENAS", "keep_heap", "limit_arenas"]

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's own cap for its dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
#: The daemon's largest heap block: a 512x512 slice's buffers (0.2-2 MiB) stay on the heap, a large file's go back.
DAEMON_MAX_BLOCK = 4 << 20
#: The daemon's malloc arenas (glibc's default is 8 per core, one per thread in practice).
DAEMON_ARENAS = 2
#: A worker's malloc arenas: its one Python thread and the JPEG 2000 decoder's threads share one. Each further
#: arena reserves 64 MiB of address space (counted by the worker's RLIMIT_AS) and keeps its own free heap.
WORKER_ARENAS = 1


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


def keep_heap(keep_bytes: int, *, max_block: int = MMAP_THRESHOLD_MAX, arenas: int = 0,
              libc: ctypes.CDLL | None = None) -> bool:
    """Let this process reuse up to ``keep_bytes`` of freed heap instead of returning it (0: glibc defaults).

    Sets ``M_MMAP_THRESHOLD`` to ``min(keep_bytes, max_block)`` (larger blocks get their own mapping and go back
    to the kernel when freed; setting it also stops glibc from raising it by itself) and ``M_TRIM_THRESHOLD``
    to ``keep_bytes``. Returns True when both were set.

    Args:
        keep_bytes: free heap the process may keep; 0 leaves malloc as it is.
        max_block: the largest block served from the heap. The daemon uses a few MiB: with its many threads
            each large request's copies would otherwise stay in the malloc arenas of whichever threads touched
            them (docs/robustness.md, limits table, "freed memory the daemon keeps").
        arenas: at most this many malloc arenas (``M_ARENA_MAX``; 0 = glibc's 8 per core). Each arena keeps
            its own free memory, so a process whose many threads handle large requests keeps a copy per arena.
            Call it before the process starts threads.
        libc: the C library to call (tests pass a fake); default: this process's glibc, if it is glibc.
    """
    if keep_bytes <= 0:
        return False
    libc = libc or _glibc()
    if libc is None:
        log.info("heap: workers.heap_keep_bytes has no effect here (libc is not glibc); malloc left as it is")
        return False
    mmap_threshold = min(int(keep_bytes), int(max_block), MMAP_THRESHOLD_MAX)
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(libc.mallopt(M_TRIM_THRESHOLD, int(keep_bytes)))
    if ok and arenas > 0:
        ok = bool(libc.mallopt(M_ARENA_MAX, int(arenas)))
    if not ok:
        log.warning("heap: mallopt refused the settings (mmap %d, trim %d bytes, arenas %d)", mmap_threshold,
                    keep_bytes, arenas)
    return ok


def limit_arenas(arenas: int, *, libc: ctypes.CDLL | None = None) -> bool:
    """Cap this process's malloc arenas at ``arenas`` (``M_ARENA_MAX``); call it before the process starts threads.

    Returns True when it was set (False where libc is not glibc or ``arenas`` is 0).
    """
    if arenas <= 0:
        return False
    libc = libc or _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, int(arenas)))
