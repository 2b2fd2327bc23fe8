"""The TensorRT backend: a fixed-batch plan built from the strongly typed W4A16 artifact, run by one thread.

Imported lazily (``appliance.engines`` names it by string): ``tensorrt`` and ``cuda.bindings`` are imported
inside :meth:`TensorrtEngine.load`, never at module import. Tests pass the shipped fakes through the
``trt_module`` and ``cudart`` options.

Threading: the thread that calls :meth:`load` owns the CUDA context and must be the only one to call
:meth:`run`, :meth:`submit`, :meth:`result` and :meth:`close` (the daemon's engine thread does all of them).

Data path per batch (two slots, rotating, so the copy of batch k+1 overlaps the compute of batch k):

1. the caller's float32 batch is copied into slot s's pinned host buffer;
2. ``cudaMemcpyAsync`` H2D on the copy stream, then event ``copied[s]``;
3. the compute stream waits for ``copied[s]``, replays slot s's CUDA graph (``execute_async_v3`` captured
   after warm-up with slot s's fixed device addresses), records ``consumed[s]`` (the input buffer is free),
   copies the outputs D2H into slot s's pinned output buffers and records ``done[s]``;
4. :meth:`result` waits for ``done[s]`` and copies the outputs out.

``submit`` refuses a third batch in flight; the copy stream waits for ``consumed[s]`` before overwriting a
slot's device input. :meth:`run` is ``result(submit(batch))``.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from appliance.engines.base import Engine, EngineOptionsSchema, OptimizationLevel, Precision, WorkspaceBytes
from appliance.errors import BackendUnavailable, EngineDeadError, EngineError

__all__ = ["MIN_COMPUTE_CAPABILITY", "TensorrtEngine", "TensorrtOptions"]

log = logging.getLogger(__name__)

#: INT4 weight-only GEMMs need Ampere or later (docs/gpu.md).
MIN_COMPUTE_CAPABILITY = (8, 0)
SLOTS = 2


def _view(ptr: int, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 numpy view of host memory at ``ptr``."""
    n = int(np.prod(shape))
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(int(ptr))).reshape(shape)


class TensorrtOptions(EngineOptionsSchema, frozen=True):
    """``[engine.options]`` of the ``tensorrt`` backend (docs/gpu.md)."""

    precision: Precision = "w4a16"  # the artifact the plan is built from ("w4a16" or "fp16")
    workspace_bytes: WorkspaceBytes = 2 << 30  # builder workspace
    optimization_level: OptimizationLevel = 3  # TensorRT builder optimisation level
    cuda_graph: bool = True  # replay each batch through a captured CUDA graph


class TensorrtEngine(Engine):
    """TensorRT 10 (>=10.13) plan, double-buffered pinned I/O, CUDA-graph replay.

    Options: ``precision`` (artifact, default ``w4a16``), ``cache_dir``, ``workspace_bytes``,
    ``optimization_level``, ``cuda_graph`` (default True), ``notifier`` (STATUS/EXTEND_TIMEOUT_USEC while
    building), ``progress`` (callback), ``trt_module`` / ``cudart`` (fakes in tests).
    """

    name = "tensorrt"
    max_in_flight = 2  # SLOTS
    DEPENDENCIES: ClassVar[dict[str, str]] = {
        "tensorrt-cu13": "TensorRT >=10.13,<11 from NVIDIA's index (docs/gpu.md)",
        "cuda-bindings": "the CUDA runtime binding (the [gpu] extra)",
    }
    OPTIONS: ClassVar[type[EngineOptionsSchema]] = TensorrtOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        precision = self.options.get("precision", "w4a16")
        if precision in self.manifest.artifacts:
            self.artifact = self.manifest.artifact(precision)
        self._trt: Any = self.options.get("trt_module")
        self._cudart: Any = self.options.get("cudart")
        self._engine: Any = None
        self._context: Any = None
        self._loaded = False
        self._streams: dict[str, Any] = {}
        self._events: dict[str, list[Any]] = {}
        self._graphs: list[Any] = []
        self._graph_execs: list[Any] = []
        self._allocs: list[tuple[str, int]] = []  # ("device"|"host", ptr)
        self._in_flight: list[int] = []  # slots submitted, oldest first
        self._next_slot = 0
        self._device_name = "not loaded"
        self.build_report: dict[str, Any] = {}
        self.graph_error: str | None = None  # why CUDA graphs are not used, if capture failed

    @classmethod
    def why_unavailable(cls) -> str | None:
        """Return why TensorRT cannot run here (package, version, driver, device, architecture), or None."""
        from appliance.engines.cuda import probe_device
        from appliance.engines.trt_build import import_tensorrt, version_problem

        reasons = []
        try:
            trt = import_tensorrt()
            problem = version_problem(getattr(trt, "__version__", "unknown"))
            if problem:
                reasons.append(problem)
        except ImportError as e:
            reasons.append(str(e))
        info = probe_device()
        if not info.ok:
            reasons.append(info.reason or "no CUDA device")
        elif info.compute_capability is not None and info.compute_capability < MIN_COMPUTE_CAPABILITY:
            reasons.append(f"{info.name} is compute capability {info.compute_capability}; INT4 weight-only GEMMs "
                           f"need {MIN_COMPUTE_CAPABILITY} (Ampere) or later")
        return "; ".join(reasons) or None

    @property
    def backend(self) -> str:
        """``tensorrt <version> on <GPU>``."""
        version = getattr(self._trt, "__version__", "?")
        return f"tensorrt:{version}:{self._device_name}"

    # ---- set-up --------------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        from appliance.engines.cuda import check

        return check(self._cudart, name, getattr(self._cudart, name)(*args))

    def load(self) -> None:
        """Probe, build or load the verified plan, allocate slots, warm up and capture the CUDA graphs."""
        from appliance.engines.cuda import import_cudart, probe_device
        from appliance.engines.trt_build import (
            BuildSettings,
            default_cache_dir,
            ensure_plan,
            import_tensorrt,
            version_problem,
        )

        try:
            if self._trt is None:
                self._trt = import_tensorrt()
            if self._cudart is None:
                self._cudart = import_cudart()
        except ImportError as e:
            raise BackendUnavailable(str(e)) from e
        problem = version_problem(self._trt.__version__)
        if problem:
            raise BackendUnavailable(problem)
        device = probe_device(self._cudart)
        if not device.ok:
            raise BackendUnavailable(device.reason or "no CUDA device")
        cc = device.compute_capability
        assert cc is not None  # device.ok: the properties were read
        self._device_name = f"{device.name} (sm {cc[0]}.{cc[1]})"
        self._call("cudaSetDevice", 0)
        settings = BuildSettings(workspace_bytes=int(self.options.get("workspace_bytes", 2 << 30)),
                                 optimization_level=int(self.options.get("optimization_level", 3)))
        try:
            self._engine, self.build_report = ensure_plan(
                self._trt, self.manifest, self.artifact, device,
                cache_dir=Path(self.options.get("cache_dir") or default_cache_dir()), settings=settings,
                notifier=self.options.get("notifier"), progress=self.options.get("progress"))
        except EngineError as e:
            raise BackendUnavailable(str(e)) from e
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise BackendUnavailable("TensorRT could not create an execution context (out of device memory?)")
        try:
            self._allocate()
        except EngineError as e:
            self.close()
            raise BackendUnavailable(f"TensorRT buffers could not be allocated: {e}") from e
        self._loaded = True
        log.info("engine loaded: %s %s on %s (%s)", self.manifest.name, self.precision, self.backend,
                 "built" if self.build_report.get("built") else "cached plan")

    def _allocate(self) -> None:
        self._shapes = {self.input_name: (self.batch_size, *self.item_shape)}
        self._shapes.update({o.name: tuple(o.shape) for o in self.manifest.outputs})
        self._bytes = {k: int(np.prod(v)) * 4 for k, v in self._shapes.items()}
        self._host: list[dict[str, int]] = []
        self._dev: list[dict[str, int]] = []
        for _ in range(SLOTS):
            host, dev = {}, {}
            for name, nbytes in self._bytes.items():
                host[name] = self._call("cudaMallocHost", nbytes)
                self._allocs.append(("host", host[name]))
                dev[name] = self._call("cudaMalloc", nbytes)
                self._allocs.append(("device", dev[name]))
            self._host.append(host)
            self._dev.append(dev)
        # non-blocking streams (no implicit sync with the legacy default stream), and events that put the waiting
        # thread to sleep and keep no timestamps: a default event spins a CPU core in cudaEventSynchronize for
        # the whole batch (GPU code review, session 19; docs/gpu.md)
        cu = self._cudart
        self._streams = {name: self._call("cudaStreamCreateWithFlags", cu.cudaStreamNonBlocking)
                         for name in ("copy", "compute")}
        flags = cu.cudaEventBlockingSync | cu.cudaEventDisableTiming
        self._events = {k: [self._call("cudaEventCreateWithFlags", flags) for _ in range(SLOTS)]
                        for k in ("copied", "consumed", "done")}
        for s in range(SLOTS):  # "consumed" starts signalled so the first copy into each slot need not wait
            self._call("cudaEventRecord", self._events["consumed"][s], self._streams["compute"])

    def _bind(self, slot: int) -> None:
        for name, ptr in self._dev[slot].items():
            if not self._context.set_tensor_address(name, int(ptr)):
                raise EngineDeadError(f"TensorRT refused the address of tensor {name!r}")

    def _enqueue_compute(self, slot: int) -> None:
        """Compute-stream work of one slot: graph replay (or a direct enqueue) plus the D2H copies."""
        stream = self._streams["compute"]
        self._call("cudaStreamWaitEvent", stream, self._events["copied"][slot], 0)
        if self._graph_execs:
            self._call("cudaGraphLaunch", self._graph_execs[slot], stream)
        else:
            self._bind(slot)
            if not self._context.execute_async_v3(int(stream)):
                raise EngineError("TensorRT execute_async_v3 failed to enqueue")
        self._call("cudaEventRecord", self._events["consumed"][slot], stream)
        d2h = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name in self.output_names:
            self._call("cudaMemcpyAsync", self._host[slot][name], self._dev[slot][name], self._bytes[name], d2h,
                       stream)
        self._call("cudaEventRecord", self._events["done"][slot], stream)

    def warmup(self, runs: int = 2) -> None:
        """Run zero batches through both slots, then capture one CUDA graph per slot (option ``cuda_graph``).

        A capture that fails is logged and the engine keeps enqueueing ``execute_async_v3`` directly
        (:attr:`graph_error` says why): slower, never wrong.
        """
        super().warmup(max(runs, SLOTS))
        if self.options.get("cuda_graph", True) and not self._graph_execs and self.graph_error is None:
            try:
                self._capture()
            except EngineError as e:
                self.graph_error = str(e)
                log.warning("TensorRT: CUDA graph capture failed, running without graphs: %s", e)
            super().warmup(SLOTS)  # replay (or run) once per slot before READY

    def _capture(self) -> None:
        stream = self._streams["compute"]
        mode = self._cudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal
        execs = []
        try:
            for slot in range(SLOTS):
                self._bind(slot)
                self._call("cudaStreamBeginCapture", stream, mode)
                ok = self._context.execute_async_v3(int(stream))
                graph = self._call("cudaStreamEndCapture", stream)
                self._graphs.append(graph)
                if not ok:
                    raise EngineError("TensorRT execute_async_v3 failed during CUDA graph capture")
                execs.append(self._call("cudaGraphInstantiate", graph, 0))
        except BaseException:  # any error, not only the engine's: a stream left capturing fails every later call
            self._cudart.cudaStreamEndCapture(stream)  # leave capture mode if the error came mid-capture
            for g in execs:
                self._cudart.cudaGraphExecDestroy(g)
            for g in self._graphs:
                self._cudart.cudaGraphDestroy(g)
            self._graphs = []
            raise
        self._graph_execs = execs
        log.info("TensorRT: captured %d CUDA graphs (one per buffer slot)", len(execs))

    # ---- running --------------------------------------------------------------------------------------

    def submit(self, batch: np.ndarray) -> int:
        """Start one ``[B, ...]`` float32 batch; return its ticket for :meth:`result` (at most 2 in flight)."""
        if not self._loaded:
            raise EngineDeadError("engine not loaded")
        expected = (self.batch_size, *self.item_shape)
        if batch.shape != expected or batch.dtype != np.float32:
            raise EngineError(f"engine input must be float32 {list(expected)}, got {batch.dtype} {list(batch.shape)}")
        if len(self._in_flight) >= SLOTS:
            raise EngineError(f"{SLOTS} batches already in flight: collect a result first")
        slot = self._next_slot
        self._next_slot = (slot + 1) % SLOTS
        copy = self._streams["copy"]
        _view(self._host[slot][self.input_name], expected)[...] = batch
        self._call("cudaStreamWaitEvent", copy, self._events["consumed"][slot], 0)
        self._call("cudaMemcpyAsync", self._dev[slot][self.input_name], self._host[slot][self.input_name],
                   self._bytes[self.input_name], self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, copy)
        self._call("cudaEventRecord", self._events["copied"][slot], copy)
        self._enqueue_compute(slot)
        self._in_flight.append(slot)
        return slot

    def result(self, ticket: int) -> dict[str, np.ndarray]:
        """Wait for the oldest batch in flight (``ticket`` must be it) and return its outputs."""
        if not self._in_flight or self._in_flight[0] != ticket:
            raise EngineError(f"result({ticket}) out of order; in flight: {self._in_flight}")
        self._in_flight.pop(0)
        try:
            self._call("cudaEventSynchronize", self._events["done"][ticket])
        except EngineError as e:
            raise EngineDeadError(f"TensorRT batch failed on the device: {e}") from e
        return {name: _view(self._host[ticket][name], self._shapes[name]).copy() for name in self.output_names}

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        return self.result(self.submit(batch))

    @property
    def graph_captured(self) -> bool:
        """True once runs replay CUDA graphs."""
        return bool(self._graph_execs)

    def close(self) -> None:
        """Wait for work in flight, then free graphs, events, streams and buffers (engine thread only)."""
        if self._cudart is None:
            return
        for stream in self._streams.values():
            self._cudart.cudaStreamSynchronize(stream)
        for g in self._graph_execs:
            self._cudart.cudaGraphExecDestroy(g)
        for g in self._graphs:
            self._cudart.cudaGraphDestroy(g)
        for events in self._events.values():
            for e in events:
                self._cudart.cudaEventDestroy(e)
        for stream in self._streams.values():
            self._cudart.cudaStreamDestroy(stream)
        for kind, ptr in self._allocs:
            (self._cudart.cudaFreeHost if kind == "host" else self._cudart.cudaFree)(ptr)
        self._graph_execs, self._graphs, self._events, self._streams, self._allocs = [], [], {}, {}, []
        self._context = self._engine = None
        self._in_flight.clear()
        self._loaded = False
