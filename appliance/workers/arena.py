"""The slot arena: ``capacity`` model inputs in one shared-memory file that every process maps.

Each worker also has an :class:`InputBuffer`: the daemon writes a request's DICOM file there and the worker copies
it out, where a pipe would cost a copy into and out of the kernel on each side (:mod:`appliance.workers.pool`).
It is an anonymous memory file (``memfd``) in no file system, handed to that one worker as a descriptor, so
patient files never reach a disk and no other worker maps them.

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

import contextlib
import errno
import mmap
import os
import secrets
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["InputBuffer", "SlotArena"]


def _shm_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class SlotArena:
    """A float32 array ``[capacity, *item_shape]`` backed by a shared file mapping."""

    def __init__(self, path: Path, capacity: int, item_shape: tuple[int, ...], *, owner: bool) -> None:
        self.path = path
        self.capacity = capacity
        self.item_shape = tuple(item_shape)
        self.owner = owner  # the daemon owns (and unlinks) it; workers only map it
        nbytes = capacity * int(np.prod(self.item_shape)) * 4
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.slots: np.ndarray = np.frombuffer(self._map, dtype=np.float32).reshape(capacity, *self.item_shape)

    @classmethod
    def create(cls, capacity: int, item_shape: tuple[int, ...]) -> SlotArena:
        """Create a zeroed arena file (mode 0600) and map it; remove arenas left by daemons that were killed."""
        nbytes = capacity * int(np.prod(item_shape)) * 4
        _remove_stale(_shm_dir())
        path = _shm_dir() / f"edge-appliance-{os.getpid()}-{secrets.token_hex(4)}.slots"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _allocate(fd, nbytes, path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return cls(path, capacity, item_shape, owner=True)

    @classmethod
    def attach(cls, path: str | Path, capacity: int, item_shape: tuple[int, ...]) -> SlotArena:
        """Map an arena created by the daemon (in a worker process)."""
        return cls(Path(path), capacity, item_shape, owner=False)

    @property
    def spec(self) -> tuple[str, int, tuple[int, ...]]:
        """What a worker needs to attach: (path, capacity, item_shape)."""
        return str(self.path), self.capacity, self.item_shape

    def close(self) -> None:
        """Unmap; the owner also removes the file."""
        self.slots = np.empty((0, *self.item_shape), np.float32)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
        if self.owner:
            self.path.unlink(missing_ok=True)


def _allocate(fd: int, nbytes: int, where: Path | str) -> None:
    """Size the file and allocate its pages now.

    A write to an unallocated page of a full tmpfs is SIGBUS, which would kill whichever process touched it; a full
    ``/dev/shm`` is better refused at start, by name.
    """
    os.ftruncate(fd, nbytes)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise OSError(e.errno, f"no room for {nbytes} bytes of shared memory in {where} (tmpfs full? the "
                                   "slot arena is batcher.queue_capacity model inputs, each worker's input buffer "
                                   "workers.input_buffer_bytes)") from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: sparse, as before
            raise


class InputBuffer:
    """One worker's input buffer: ``size`` bytes of an anonymous memory file, mapped by the daemon and the worker."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("edge-appliance-input", os.MFD_CLOEXEC)
        try:
            _allocate(self.fd, size, "memfd")
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.bytes: np.ndarray = np.frombuffer(self._map, dtype=np.uint8)

    @staticmethod
    def attach(fd: int, size: int) -> np.ndarray:
        """Map a buffer received as descriptor ``fd`` (in the worker; the descriptor is closed)."""
        try:
            return np.frombuffer(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE), np.uint8)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap and close (the memory goes once the workers that map it have exited too)."""
        self.bytes = np.empty(0, np.uint8)
        with contextlib.suppress(BufferError):  # a view is still alive somewhere; the mapping goes with the process
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


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
