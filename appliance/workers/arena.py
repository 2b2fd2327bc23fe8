"""The slot arena: ``capacity`` model inputs in one shared-memory file that every process maps.

The same mapping, as bytes, carries each worker's input buffer: the daemon writes a request's DICOM file there
and the worker copies it out, where a pipe would cost a copy into and out of the kernel on each side
(:mod:`appliance.workers.pool`).

The daemon creates it (``SlotArena.create``); each preprocessing worker process maps the same file
(``SlotArena.attach``) and writes a frame's model input straight into its slot; the engine thread gathers slots
into the batch buffer. Only slot indices cross the worker pipes, never pixels (docs/robustness.md).

The file lives in ``/dev/shm`` (or the temp directory where that is missing), mode 0600, and is unlinked by the
daemon on close. A plain file mapping is used instead of ``multiprocessing.shared_memory`` because worker processes
are started by a fork server and must not register the segment with a resource tracker that could unlink it when a
worker dies. On a GPU box an engine may pin this mapping (``cudaHostRegister``) so decode -> slot -> device needs no
extra host copy.
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["SlotArena"]


def _shm_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class SlotArena:
    """An array ``[capacity, *item_shape]`` (float32 model inputs, or uint8 bytes) backed by a shared file mapping."""

    def __init__(self, path: Path, capacity: int, item_shape: tuple[int, ...], dtype: str = "float32", *,
                 owner: bool) -> None:
        self.path = path
        self.capacity = capacity
        self.item_shape = tuple(item_shape)
        self.dtype = dtype
        self.owner = owner  # the daemon owns (and unlinks) it; workers only map it
        nbytes = capacity * int(np.prod(self.item_shape)) * np.dtype(dtype).itemsize
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.slots: np.ndarray = np.frombuffer(self._map, dtype=dtype).reshape(capacity, *self.item_shape)

    @classmethod
    def create(cls, capacity: int, item_shape: tuple[int, ...], dtype: str = "float32") -> SlotArena:
        """Create a zeroed arena file (mode 0600) and map it; remove arenas left by daemons that were killed."""
        nbytes = capacity * int(np.prod(item_shape)) * np.dtype(dtype).itemsize
        _remove_stale(_shm_dir())
        path = _shm_dir() / f"edge-appliance-{os.getpid()}-{secrets.token_hex(4)}.slots"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        return cls(path, capacity, item_shape, dtype, owner=True)

    @classmethod
    def attach(cls, path: str | Path, capacity: int, item_shape: tuple[int, ...], dtype: str = "float32") -> SlotArena:
        """Map an arena created by the daemon (in a worker process)."""
        return cls(Path(path), capacity, item_shape, dtype, owner=False)

    @property
    def spec(self) -> tuple[str, int, tuple[int, ...], str]:
        """What a worker needs to attach: (path, capacity, item_shape, dtype)."""
        return str(self.path), self.capacity, self.item_shape, self.dtype

    def close(self) -> None:
        """Unmap; the owner also removes the file."""
        self.slots = np.empty((0, *self.item_shape), self.dtype)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
        if self.owner:
            self.path.unlink(missing_ok=True)


def _remove_stale(directory: Path) -> None:
    """Unlink our arena files whose daemon is gone (SIGKILL, OOM kill): ``edge-appliance-<pid>-<hex>.slots``."""
    for path in directory.glob("edge-appliance-*-*.slots"):
        try:
            pid = int(path.name.split("-")[2])
            if pid == os.getpid() or path.stat().st_uid != os.getuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue
