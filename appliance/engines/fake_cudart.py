"""A fake ``cuda.bindings.runtime``: the calls the TensorRT backend makes, with the real signatures.

Each function has the real binding's name, parameters and return convention (a tuple whose first item is a
:class:`cudaError_t`); tests/gpu/test_gpu_fakes_conformance.py compares them with the real module via
:func:`inspect.signature`. Behaviour that the backend's logic depends on is modelled:

* memory: ``cudaMalloc``/``cudaMallocHost`` return real addresses of host memory, so the backend's ctypes
  views and ``cudaMemcpyAsync`` move real bytes; ``live_allocations()`` shows leaks;
* streams are queues that run only when synchronized (``cudaStreamSynchronize``/``cudaEventSynchronize``),
  so reading an output before waiting gives stale data, as on a GPU; events order streams
  (``cudaStreamWaitEvent``); ``timeline`` records when each operation was enqueued and what was pending;
* graph capture: between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` operations are recorded, not
  run; ``cudaGraphLaunch`` replays them;
* a device can be absent (``FakeCuda(devices=0)`` -> ``cudaErrorNoDevice``) or the driver missing
  (``driver=False`` -> ``cudaErrorInsufficientDriver``, what the real binding says on a box without one).

The module-level functions act on :data:`STATE`; :func:`reset` installs a new one. The fake ``tensorrt``
module enqueues its kernels with :func:`enqueue`.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STATE",
    "FakeCuda",
    "cudaDeviceProp",
    "cudaDriverGetVersion",
    "cudaError_t",
    "cudaEventBlockingSync",
    "cudaEventCreate",
    "cudaEventCreateWithFlags",
    "cudaEventDefault",
    "cudaEventDisableTiming",
    "cudaEventDestroy",
    "cudaEventRecord",
    "cudaEventSynchronize",
    "cudaEvent_t",
    "cudaFree",
    "cudaFreeHost",
    "cudaGetDeviceCount",
    "cudaGetDeviceProperties",
    "cudaGetErrorName",
    "cudaGraphDestroy",
    "cudaGraphExecDestroy",
    "cudaGraphInstantiate",
    "cudaGraphLaunch",
    "cudaMalloc",
    "cudaMallocHost",
    "cudaMemcpyAsync",
    "cudaMemcpyKind",
    "cudaRuntimeGetVersion",
    "cudaSetDevice",
    "cudaStreamBeginCapture",
    "cudaStreamCaptureMode",
    "cudaStreamCreate",
    "cudaStreamCreateWithFlags",
    "cudaStreamDefault",
    "cudaStreamDestroy",
    "cudaStreamEndCapture",
    "cudaStreamNonBlocking",
    "cudaStreamSynchronize",
    "cudaStreamWaitEvent",
    "cudaStream_t",
    "enqueue",
    "reset",
]


#: Stream and event creation flags: plain ints in the real ``cuda.bindings.runtime``, as here.
cudaStreamDefault = 0  # noqa: N816
cudaStreamNonBlocking = 1  # noqa: N816
cudaEventDefault = 0  # noqa: N816
cudaEventBlockingSync = 1  # noqa: N816
cudaEventDisableTiming = 2  # noqa: N816


class cudaError_t(enum.IntEnum):  # noqa: N801 - the real binding's name
    """The error codes the fake can return (values as in the CUDA runtime)."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidResourceHandle = 400
    cudaErrorStreamCaptureInvalidated = 901


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    """Copy directions."""

    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStreamCaptureMode(enum.IntEnum):  # noqa: N801
    """Capture modes."""

    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


class _Handle:
    """An opaque handle that ``int()`` turns into its value, like the binding's pointer types."""

    _ids = itertools.count(0x1000)

    def __init__(self) -> None:
        self._value = next(self._ids)

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} 0x{self._value:x}>"


class cudaStream_t(_Handle):  # noqa: N801
    """A stream: a queue of operations run on synchronization."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[tuple[str, Callable[[], None]]] = []
        self.capture: list[tuple[str, Callable[[], None]]] | None = None
        self.flags = 0  # cudaStreamCreateWithFlags' flags


class cudaEvent_t(_Handle):  # noqa: N801
    """An event: the point in a stream's queue where it was recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.stream: cudaStream_t | None = None
        self.flags = 0  # cudaEventCreateWithFlags' flags
        self.fired = True


class cudaGraph_t(_Handle):  # noqa: N801
    """A captured sequence of operations."""

    def __init__(self, ops: list[tuple[str, Callable[[], None]]]) -> None:
        super().__init__()
        self.ops = ops


class cudaGraphExec_t(cudaGraph_t):  # noqa: N801
    """An instantiated graph."""


@dataclass
class cudaDeviceProp:  # noqa: N801
    """The fields of ``cudaDeviceProp`` the backend reads."""

    name: bytes = b"NVIDIA GeForce RTX 4090"
    major: int = 8
    minor: int = 9
    totalGlobalMem: int = 24 << 30  # noqa: N815


@dataclass
class FakeCuda:
    """The fake machine: devices, driver, memory, and a record of what ran."""

    devices: int = 1
    driver: bool = True
    prop: cudaDeviceProp = field(default_factory=cudaDeviceProp)
    fail: dict[str, cudaError_t] = field(default_factory=dict)  # function name -> error to return
    memory: dict[int, Any] = field(default_factory=dict)  # address -> ctypes buffer (device and pinned)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # every enqueue: label, stream, pending
    graph_launches: int = 0
    streams: list[cudaStream_t] = field(default_factory=list)

    def live_allocations(self) -> int:
        """Allocations not yet freed."""
        return len(self.memory)

    def pending(self) -> list[str]:
        """Labels of operations enqueued on any stream and not yet run."""
        return [label for s in self.streams for label, _ in s.queue]


STATE = FakeCuda()


def reset(**kwargs: Any) -> FakeCuda:
    """Install and return a fresh :class:`FakeCuda` (keyword arguments as its fields)."""
    global STATE
    STATE = FakeCuda(**kwargs)
    return STATE


def _gate(name: str, need_device: bool = True) -> cudaError_t:
    if name in STATE.fail:
        return STATE.fail[name]
    if not STATE.driver:
        return cudaError_t.cudaErrorInsufficientDriver
    if need_device and STATE.devices == 0:
        return cudaError_t.cudaErrorNoDevice
    return cudaError_t.cudaSuccess


def enqueue(stream: Any, label: str, op: Callable[[], None]) -> cudaError_t:
    """Put ``op`` on ``stream`` (or into its capture); the fake kernels of fake ``tensorrt`` use this."""
    s = _stream(stream)
    if s is None:
        return cudaError_t.cudaErrorInvalidResourceHandle
    STATE.timeline.append({"label": label, "stream": int(s), "pending": STATE.pending(),
                           "capturing": s.capture is not None})
    (s.capture if s.capture is not None else s.queue).append((label, op))
    return cudaError_t.cudaSuccess


def _stream(stream: Any) -> cudaStream_t | None:
    if isinstance(stream, cudaStream_t):
        return stream
    for s in STATE.streams:
        if int(s) == int(stream):
            return s
    return None


def _drain(s: cudaStream_t, until: Callable[[], None] | None = None) -> None:
    while s.queue:
        label, op = s.queue.pop(0)
        op()
        if until is not None and op is until:
            return


def cudaGetErrorName(error: cudaError_t) -> tuple[cudaError_t, bytes]:  # noqa: N802
    """The error's name."""
    return cudaError_t.cudaSuccess, cudaError_t(error).name.encode()


def cudaRuntimeGetVersion() -> tuple[cudaError_t, int]:  # noqa: N802
    """The runtime version (13.5)."""
    return cudaError_t.cudaSuccess, 13050


def cudaDriverGetVersion() -> tuple[cudaError_t, int]:  # noqa: N802
    """The driver's CUDA version, 0 without a driver (as the real call)."""
    return cudaError_t.cudaSuccess, 13050 if STATE.driver else 0


def cudaGetDeviceCount() -> tuple[cudaError_t, int | None]:  # noqa: N802
    """Number of devices."""
    err = _gate("cudaGetDeviceCount")
    return (err, STATE.devices) if err == cudaError_t.cudaSuccess else (err, None)


def cudaSetDevice(device) -> tuple[cudaError_t]:  # noqa: N802
    """Select a device (only 0 exists)."""
    err = _gate("cudaSetDevice")
    if err == cudaError_t.cudaSuccess and device >= STATE.devices:
        err = cudaError_t.cudaErrorInvalidValue
    return (err,)


def cudaGetDeviceProperties(device) -> tuple[cudaError_t, cudaDeviceProp | None]:  # noqa: N802
    """The device's properties."""
    err = _gate("cudaGetDeviceProperties")
    return (err, STATE.prop) if err == cudaError_t.cudaSuccess else (err, None)


def _alloc(name: str, size: int) -> tuple[cudaError_t, int]:
    err = _gate(name)
    if err != cudaError_t.cudaSuccess:
        return err, 0
    buf = ctypes.create_string_buffer(max(int(size), 1))
    addr = ctypes.addressof(buf)
    STATE.memory[addr] = buf
    return cudaError_t.cudaSuccess, addr


def cudaMalloc(size) -> tuple[cudaError_t, int]:  # noqa: N802
    """Device memory (host memory in the fake, at a real address)."""
    return _alloc("cudaMalloc", size)


def cudaMallocHost(size) -> tuple[cudaError_t, int]:  # noqa: N802
    """Pinned host memory."""
    return _alloc("cudaMallocHost", size)


def _free(ptr: Any) -> tuple[cudaError_t]:
    if STATE.memory.pop(int(ptr), None) is None:
        return (cudaError_t.cudaErrorInvalidValue,)
    return (cudaError_t.cudaSuccess,)


def cudaFree(devPtr) -> tuple[cudaError_t]:  # noqa: N802, N803
    """Free device memory."""
    return _free(devPtr)


def cudaFreeHost(ptr) -> tuple[cudaError_t]:  # noqa: N802
    """Free pinned host memory."""
    return _free(ptr)


def cudaMemcpyAsync(dst, src, count, kind: cudaMemcpyKind, stream) -> tuple[cudaError_t]:  # noqa: N802
    """Enqueue a copy of ``count`` bytes on ``stream``."""
    err = _gate("cudaMemcpyAsync")
    if err != cudaError_t.cudaSuccess:
        return (err,)
    d, s, n = int(dst), int(src), int(count)

    def copy() -> None:
        ctypes.memmove(d, s, n)

    return (enqueue(stream, f"memcpy {cudaMemcpyKind(kind).name}", copy),)


def cudaStreamCreate() -> tuple[cudaError_t, cudaStream_t | None]:  # noqa: N802
    """A new stream."""
    err = _gate("cudaStreamCreate")
    if err != cudaError_t.cudaSuccess:
        return err, None
    s = cudaStream_t()
    STATE.streams.append(s)
    return cudaError_t.cudaSuccess, s


def cudaStreamCreateWithFlags(flags) -> tuple[cudaError_t, cudaStream_t | None]:  # noqa: N802
    """A new stream; ``flags`` is ``cudaStreamDefault`` or ``cudaStreamNonBlocking`` (kept on the stream)."""
    if int(flags) not in (cudaStreamDefault, cudaStreamNonBlocking):
        return cudaError_t.cudaErrorInvalidValue, None
    err, s = cudaStreamCreate()
    if s is not None:
        s.flags = int(flags)
    return err, s


def cudaStreamDestroy(stream) -> tuple[cudaError_t]:  # noqa: N802
    """Destroy a stream (its pending work runs first, as on a GPU)."""
    s = _stream(stream)
    if s is None:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    _drain(s)
    STATE.streams.remove(s)
    return (cudaError_t.cudaSuccess,)


def cudaStreamSynchronize(stream) -> tuple[cudaError_t]:  # noqa: N802
    """Run everything enqueued on ``stream``."""
    s = _stream(stream)
    if s is None:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    _drain(s)
    return (cudaError_t.cudaSuccess,)


def cudaEventCreate() -> tuple[cudaError_t, cudaEvent_t | None]:  # noqa: N802
    """A new event."""
    err = _gate("cudaEventCreate")
    return (err, cudaEvent_t()) if err == cudaError_t.cudaSuccess else (err, None)


def cudaEventCreateWithFlags(flags) -> tuple[cudaError_t, cudaEvent_t | None]:  # noqa: N802
    """A new event; ``flags`` ORs ``cudaEventBlockingSync``, ``cudaEventDisableTiming`` (kept on the event)."""
    if int(flags) & ~(cudaEventBlockingSync | cudaEventDisableTiming):
        return cudaError_t.cudaErrorInvalidValue, None
    err, e = cudaEventCreate()
    if e is not None:
        e.flags = int(flags)
    return err, e


def cudaEventDestroy(event) -> tuple[cudaError_t]:  # noqa: N802
    """Destroy an event."""
    return (cudaError_t.cudaSuccess,)


def cudaEventRecord(event, stream) -> tuple[cudaError_t]:  # noqa: N802
    """Record ``event`` at the current end of ``stream``'s queue."""
    s = _stream(stream)
    if s is None:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    event.stream, event.fired = s, False

    def marker() -> None:
        event.fired = True

    event.marker = marker
    return (enqueue(s, "event", marker),)


def _wait_for(stream: cudaStream_t | None, marker: Callable[[], None] | None) -> None:
    if stream is not None and marker is not None and any(op is marker for _, op in stream.queue):
        _drain(stream, until=marker)


def cudaEventSynchronize(event) -> tuple[cudaError_t]:  # noqa: N802
    """Run ``event``'s stream up to the event's most recent record."""
    _wait_for(event.stream, getattr(event, "marker", None))
    return (cudaError_t.cudaSuccess,)


def cudaStreamWaitEvent(stream, event, flags) -> tuple[cudaError_t]:  # noqa: N802
    """Make ``stream`` wait for ``event``'s record as of *this call* (as CUDA does), not a later one."""
    target, marker = event.stream, getattr(event, "marker", None)
    return (enqueue(stream, "wait", lambda: _wait_for(target, marker)),)


def cudaStreamBeginCapture(stream, mode: cudaStreamCaptureMode) -> tuple[cudaError_t]:  # noqa: N802
    """Start recording ``stream``'s operations into a graph."""
    s = _stream(stream)
    if s is None or s.capture is not None:
        return (cudaError_t.cudaErrorInvalidValue,)
    s.capture = []
    return (cudaError_t.cudaSuccess,)


def cudaStreamEndCapture(stream) -> tuple[cudaError_t, cudaGraph_t | None]:  # noqa: N802
    """Stop recording; return the graph."""
    s = _stream(stream)
    if s is None or s.capture is None:
        return cudaError_t.cudaErrorStreamCaptureInvalidated, None
    graph, s.capture = cudaGraph_t(s.capture), None
    return cudaError_t.cudaSuccess, graph


def cudaGraphInstantiate(graph, flags) -> tuple[cudaError_t, cudaGraphExec_t | None]:  # noqa: N802
    """Instantiate a captured graph."""
    err = _gate("cudaGraphInstantiate")
    return (err, cudaGraphExec_t(list(graph.ops))) if err == cudaError_t.cudaSuccess else (err, None)


def cudaGraphLaunch(graphExec, stream) -> tuple[cudaError_t]:  # noqa: N802, N803
    """Enqueue the graph's operations on ``stream``."""
    err = _gate("cudaGraphLaunch")
    if err != cudaError_t.cudaSuccess:
        return (err,)
    STATE.graph_launches += 1
    ops = list(graphExec.ops)

    def replay() -> None:
        for _, op in ops:
            op()

    return (enqueue(stream, "graph", replay),)


def cudaGraphDestroy(graph) -> tuple[cudaError_t]:  # noqa: N802
    """Destroy a graph."""
    return (cudaError_t.cudaSuccess,)


def cudaGraphExecDestroy(graphExec) -> tuple[cudaError_t]:  # noqa: N802, N803
    """Destroy an instantiated graph."""
    return (cudaError_t.cudaSuccess,)
