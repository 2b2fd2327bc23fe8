"""The preprocessing worker process: parse, validate, decode and preprocess, straight into shared slots.

One worker runs one request at a time, driven by its supervisor thread in the daemon over a duplex pipe
(:mod:`appliance.workers.pool`). Messages, daemon -> worker::

    ("parse", job_id, pipeline_name, size)                  -> ("parsed", job_id, n_frames, sop_uid, rss, ms)
    ("frame", job_id, frame_index, slot, last, threads)     -> ("frame", job_id, frame_info, ms, rss)
    ("drop", job_id)                                        -> (no reply: forget the parsed instance)
    ("stop",)                                               -> (exit 0)

and any step may answer ``("error", job_id, encoded_error, rss)`` instead. A frame message with ``last`` true also
forgets the instance once it is answered (the common path costs no drop message); the daemon sends ``drop`` only
when a job ends before its last frame was asked for. ``threads`` is how many threads the frame may decode on
(the cores the daemon found idle; only the JPEG 2000 decoder uses more than one). The DICOM file is the first
``size`` bytes of the worker's input buffer (the worker copies it out and zeroes them; the buffer's descriptor is
the daemon's first message, before any of these), or, with ``size`` -1, follows on the pipe (``send_bytes``: a
file larger than the buffer). Otherwise only small metadata crosses the pipe; the model input goes into the slot
arena.

Whatever the foreign decoder does, the worker answers or dies: Python exceptions (a Rust panic is a
``BaseException``) become an error reply; ``MemoryError`` under the address-space limit becomes
RESOURCE_EXHAUSTED; a segfault, an abort or a spin kills the process, and the supervisor replaces it
(docs/robustness.md).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import resource
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from appliance import dicom
from appliance.dicom.openjpeg import set_decoder_threads
from appliance.errors import ApplianceError, DicomError, Overloaded
from appliance.heap import WORKER_ARENAS, keep_heap, limit_arenas
from appliance.logs import configure_logging
from appliance.pipeline.loader import load_pipelines
from appliance.pipeline.preprocess import Pipeline
from appliance.privacy import redact_foreign
from appliance.workers.arena import InputBuffer, SlotArena

__all__ = ["FAULT_ROOT", "FAULTS", "WorkerSpec", "decode_error", "encode_error", "worker_main"]

# Test-only fault injection (docs/robustness.md): with APPLIANCE_TEST_DECODER_FAULTS=1 in the daemon's environment,
# an instance whose SOP Instance UID is FAULT_ROOT + "." + <code> makes the worker misbehave while decoding.
FAULT_ROOT = "1.2.826.0.1.3680043.10.1289.999"
FAULTS = {"1": "segfault", "2": "abort", "3": "panic", "4": "alloc", "5": "spin", "6": "exit"}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to start (pickled to the fork server once per worker)."""

    arena: tuple[str, int, tuple[int, ...]]  # SlotArena.spec
    pipelines_dir: str
    models_dir: str
    model: str  # only pipelines for this model are loaded
    limits: dicom.DicomLimits
    memory_bytes: int  # address space a worker may add on top of what it has after start-up (RLIMIT_AS)
    nice: int = 0  # added to the worker's niceness: the engine thread and the event loop come first
    heap_keep_bytes: int = 0  # free heap the worker keeps for reuse (appliance.heap); 0 = glibc's defaults
    faults: bool = False  # test-only fault injection
    # Size of the worker's input buffer (an InputBuffer whose descriptor the daemon sends first); 0 = none
    input_bytes: int = 0


_TAG = re.compile(r"\([0-9A-Fa-f]{4},[0-9A-Fa-f]{4}\)")


class _Panic(BaseException):
    """Stands in for ``pyo3_runtime.PanicException`` (a BaseException raised by Rust decoders)."""


def encode_error(error: BaseException) -> tuple[str, str, str, str]:
    """Return a picklable (class name, message, field, reason) for an error raised in a worker."""
    if isinstance(error, ApplianceError):
        return type(error).__name__, str(error), getattr(error, "field", "dicom"), error.reason
    if isinstance(error, MemoryError):
        return "Overloaded", "decoding needs more memory than the worker's limit", "dicom", "DECODER_MEMORY_LIMIT"
    # a foreign message may quote the file's bytes (patient data): values redacted, then cut to one short line
    full = redact_foreign(" ".join(str(error).split()))
    tag = _TAG.search(full)  # pydicom names the element it was reading: put it first, a long message is cut
    where = f" on {tag.group(0)}" if tag else ""
    return "DicomError", f"decoder failed{where}: {type(error).__name__}: {full[:200]}".rstrip(": "), \
        "dicom.PixelData", ""


def decode_error(encoded: tuple[str, str, str, str]) -> ApplianceError:
    """Rebuild an :class:`ApplianceError` from :func:`encode_error`'s tuple (in the daemon)."""
    from appliance import errors

    name, message, field, reason = encoded
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, ApplianceError)):
        cls = errors.DicomError
    error: ApplianceError
    if issubclass(cls, errors.InputError):
        error = cls(message, field=field)
    elif issubclass(cls, errors.Overloaded):
        error = cls(message, retry_after_s=None, reason=reason or None)
    elif issubclass(cls, errors.Unavailable):
        error = cls(message, reason=reason or "UNAVAILABLE")
    else:
        error = cls(message)
    if reason:
        error.reason = reason
    return error


_PAGE = os.sysconf("SC_PAGE_SIZE")
_statm = (0, -1)  # (pid, fd): this process's /proc/self/statm kept open; a pread costs a sixth of open+read+close


def _statm_pages(field: int) -> int:
    global _statm
    try:
        pid = os.getpid()
        if _statm[0] != pid:  # a forked child inherits the fd, which still reads its parent's figures
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 128, 0).split()[field])
    except (OSError, ValueError, IndexError):
        return 0


def _rss_bytes() -> int:
    return _statm_pages(1) * _PAGE


def _vm_bytes() -> int:
    return _statm_pages(0) * _PAGE


def _limit_memory(extra: int) -> None:
    """Cap the address space at what the worker uses now plus ``extra`` bytes."""
    if extra <= 0:
        return
    limit = _vm_bytes() + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _fault(kind: str) -> None:  # pragma: no cover - runs in a worker that is meant to die
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    elif kind == "panic":
        raise _Panic("called `Result::unwrap()` on an `Err` value (test fault)")
    elif kind == "alloc":
        hoard = []
        while True:
            hoard.append(np.ones(64 << 20, dtype=np.uint8))
    elif kind == "spin":
        while True:
            pass
    elif kind == "exit":
        os._exit(3)


class _Worker:
    def __init__(self, conn: Connection, spec: WorkerSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.arena = SlotArena.attach(*spec.arena)
        # the daemon's first message on the pipe is the input buffer's descriptor (SCM_RIGHTS)
        self.inbox = InputBuffer.attach(recv_handle(conn), spec.input_bytes) if spec.input_bytes > 0 else None
        self.pipelines: dict[str, Pipeline] = {
            name: p
            for name, p in load_pipelines(Path(spec.pipelines_dir), Path(spec.models_dir)).items()
            if p.model == spec.model
        }
        self.job: int | None = None
        self.instance: dicom.DicomInstance | None = None
        self.pipeline: Pipeline | None = None

    def serve(self) -> None:
        while True:
            msg = self.conn.recv()
            op = msg[0]
            if op == "stop":
                return
            if op == "drop":
                self.job = self.instance = self.pipeline = None
                continue
            job = msg[1]
            try:
                reply = (self._parse(job, msg[2], msg[3]) if op == "parse"
                         else self._frame(job, msg[2], msg[3], msg[5]))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - foreign code: every failure becomes this item's error
                reply = ("error", job, encode_error(e), _rss_bytes())
            if op == "frame" and msg[4]:  # the job's last frame: nothing more will be asked of this instance
                self.job = self.instance = self.pipeline = None
            self.conn.send(reply)

    def _parse(self, job: int, pipeline_name: str, size: int) -> tuple[Any, ...]:
        if size < 0:
            data = self.conn.recv_bytes()
        elif self.inbox is not None and size <= self.inbox.size:
            try:
                data = self.inbox[:size].tobytes()
            finally:
                self.inbox[:size] = 0  # a patient's file stays in shared memory no longer than this copy takes
        else:
            raise ApplianceError(f"internal error: a file of {size} bytes cannot be in the worker's input buffer")
        t0 = time.perf_counter()
        self.job, self.instance, self.pipeline = job, None, None
        pipeline = self.pipelines.get(pipeline_name)
        if pipeline is None:
            raise DicomError(f"pipeline {pipeline_name!r} is not loaded in the worker", field="pipeline")
        instance = dicom.parse(data, self.spec.limits)
        del data
        pipeline.check(instance)
        self.job, self.instance, self.pipeline = job, instance, pipeline
        return ("parsed", job, instance.number_of_frames, instance.sop_instance_uid, _rss_bytes(),
                (time.perf_counter() - t0) * 1000.0)

    def _frame(self, job: int, index: int, slot: int, threads: int) -> tuple[Any, ...]:
        if job != self.job or self.instance is None or self.pipeline is None:
            raise Overloaded("worker lost the parsed instance (replaced mid-request)", retry_after_s=0.1)
        t0 = time.perf_counter()
        set_decoder_threads(threads)
        if self.spec.faults and self.instance.sop_instance_uid.startswith(FAULT_ROOT + "."):
            _fault(FAULTS.get(self.instance.sop_instance_uid.rsplit(".", 1)[1], ""))
        info = self.pipeline.run(self.instance, index, self.arena.slots[slot])
        return ("frame", job, info, (time.perf_counter() - t0) * 1000.0, _rss_bytes())


#: The worker's oom_score_adj: a decoder, which the daemon replaces, goes before the daemon (whose unit sets -500).
WORKER_OOM_SCORE_ADJ = 500


def _prefer_for_oom() -> None:
    """Ask the kernel's OOM killer to pick this worker before the daemon (raising it needs no privilege)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(WORKER_OOM_SCORE_ADJ))
    except OSError:  # not Linux, or /proc read-only: the unit's OOMPolicy=continue still keeps the service
        pass


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Entry point of a worker process (started by the pool's fork server)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when workers stop
    os.environ["RUST_BACKTRACE"] = "0"  # a decoder panic is one error reply, not a backtrace in the journal
    configure_logging("warning", "auto")  # journald under systemd; third-party loggers quieted (docs/security.md)
    logging.getLogger("pydicom").setLevel(logging.CRITICAL)  # its warnings can quote element values
    warnings.simplefilter("ignore")
    sys.setrecursionlimit(2000)  # deeply nested sequences end in RecursionError -> a client error
    # Pillow refuses an image over twice MAX_IMAGE_PIXELS and only warns below that (warnings are ignored here),
    # so half the limit makes it refuse what the limit refuses: a second SOF the codestream check did not read.
    Image.MAX_IMAGE_PIXELS = (spec.limits.max_pixels_per_frame + 1) // 2
    if spec.nice > 0:
        os.nice(spec.nice)
    _prefer_for_oom()
    limit_arenas(WORKER_ARENAS)  # before the decoder starts any thread (appliance.heap)
    keep_heap(spec.heap_keep_bytes)
    worker = _Worker(conn, spec)
    _limit_memory(spec.memory_bytes)
    conn.send(("ready", os.getpid(), _rss_bytes()))
    try:
        worker.serve()
    except (EOFError, OSError):  # the daemon went away
        pass
