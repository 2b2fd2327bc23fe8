"""ONNX Runtime backends: CPU (the embedded default and the reference), CUDA, and the TensorRT provider.

Session settings (docs/gpu.md): ``ORT_ENABLE_ALL`` (fuses INT4 DQ->MatMul into MatMulNBits on the CPU),
``ORT_SEQUENTIAL``, one inter-op thread, intra-op threads = the cores not used by DICOM decoding.

ONNX Runtime falls back to the CPU silently, so a GPU backend:

* is probed by :func:`probe_provider` by actually trying, in this order: the ``onnxruntime`` module, the two
  distributions never installed together, the provider in this build, its shared library loading (the dlopen
  error names the missing CUDA/cuDNN/TensorRT library), the CUDA driver and device (``cudaGetDeviceCount``
  through cuda-bindings), and finally a session on a tiny graph with ``session.disable_cpu_ep_fallback=1``;
* creates its own session with ``session.disable_cpu_ep_fallback=1`` and checks ``get_providers()[0]``:
  a CPU fallback is :class:`~appliance.errors.BackendUnavailable`, never a silent downgrade.

The CUDA backend binds fixed device buffers (IOBinding) and sets ``enable_cuda_graph``, so after the first run
ONNX Runtime replays a CUDA graph; new inputs are copied into the same buffer with ``update_inplace``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import logging
import os
import re
import threading
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
from msgspec import Meta

from appliance.engines.base import (
    DeviceId,
    Engine,
    EngineOptionsSchema,
    OptimizationLevel,
    Precision,
    WorkspaceBytes,
    usable_cores,
)
from appliance.errors import BackendUnavailable, EngineDeadError, EngineError

__all__ = [
    "PROBE_GRAPH",
    "OrtCpuEngine",
    "OrtCudaEngine",
    "OrtCudaOptions",
    "OrtTensorrtEngine",
    "OrtTensorrtOptions",
    "check_distributions",
    "probe_provider",
]

log = logging.getLogger(__name__)

#: A 108-byte ONNX graph (y = x + x, [1, 8] float32) used to try a provider for real.
PROBE_GRAPH = Path(__file__).with_name("probe.onnx")

_LIBS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_distributions() -> str | None:
    """Return an error if both ``onnxruntime`` and ``onnxruntime-gpu`` are installed, else None.

    Both provide the ``onnxruntime`` module; installed together, one shadows the other and only the CPU
    provider remains. The daemon refuses to start on this (``[cpu]`` and ``[gpu]`` are exclusive extras).
    """
    cpu, gpu = _installed("onnxruntime"), _installed("onnxruntime-gpu")
    if cpu and gpu:
        return (f"onnxruntime {cpu} and onnxruntime-gpu {gpu} are both installed; they provide the same "
                "module and shadow each other: pip uninstall -y onnxruntime onnxruntime-gpu, then install "
                "exactly one extra ('edge-appliance[cpu]' or '[gpu]')")
    return None


def _library_error(ort: Any, provider: str) -> str | None:
    """Dlopen the provider's shared library as ONNX Runtime would; return the loader's error or None."""
    short = _LIBS[provider]
    capi = Path(ort.__file__).parent / "capi"
    lib = capi / f"libonnxruntime_providers_{short}.so"
    if not lib.is_file():
        return f"{lib.name} is not part of this onnxruntime installation"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(lib))
    except OSError as e:
        text = str(e)
        missing = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", text)
        what = missing.group(1) if missing else text
        hint = ("TensorRT 10 libraries (libnvinfer.so.10: docs/gpu.md)" if "nvinfer" in what or
                "nvonnxparser" in what else "CUDA 13 / cuDNN 9 libraries (pip install "
                "'onnxruntime-gpu[cuda,cudnn]' or the system CUDA toolkit: docs/gpu.md)")
        return f"{lib.name} cannot load: {what} not found; install the {hint}"
    return None


def _device_error() -> str | None:
    """Ask CUDA whether a driver and a device exist (cuda-bindings if installed, else libcuda directly)."""
    from appliance.engines.cuda import probe_device

    try:
        import cuda.bindings.runtime  # noqa: F401 - only to know whether the binding is there
    except ImportError:
        try:
            libcuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return "no NVIDIA driver: libcuda.so.1 cannot be loaded"
        count = ctypes.c_int(0)
        if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return "no CUDA GPU: the NVIDIA driver is loaded but reports no device"
        return None
    info = probe_device()
    return None if info.ok else info.reason


@functools.cache
def probe_provider(provider: str) -> str | None:
    """Return None if ``provider`` really runs a session here, else every reason it does not (cached)."""
    try:
        ort = _ort()
    except ImportError:
        return "onnxruntime is not installed (pip install 'edge-appliance[cpu]' or '[gpu]')"
    both = check_distributions()
    if both:
        return both
    available = ort.get_available_providers()
    if provider not in available:
        wheel = "onnxruntime-gpu" if _installed("onnxruntime-gpu") else "onnxruntime (the CPU wheel)"
        return (f"{provider} is not in this build ({wheel} {ort.__version__} has {', '.join(available)}); "
                "the GPU backends need onnxruntime-gpu (the [gpu] extra)")
    if provider == "CPUExecutionProvider":
        return None
    reasons = [r for r in (_library_error(ort, provider), _device_error()) if r]
    if reasons:
        return "; ".join(reasons)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = ort.InferenceSession(str(PROBE_GRAPH), sess_options=so, providers=[provider])
    except Exception as e:  # ORT raises its own exception types
        return f"{provider} could not run a one-node graph: {e}"
    actual = session.get_providers()[0]
    if actual != provider:
        return f"{provider} was asked for but {actual} runs the session"
    return None


#: How far below the preprocessing workers the burst pool's threads run. The workers' niceness, added to the
#: daemon's, is the option ``worker_nice`` (the daemon passes ``[workers] nice``; 0 for an engine without workers).
BURST_NICE_GAP = 5


def _native_threads() -> set[int]:
    """Ids of this process's threads that Python did not start (Linux; empty elsewhere).

    Python's own threads (supervisors, executors, the event loop) are left out, so a thread one of them starts
    while a session is created is never mistaken for one of ONNX Runtime's.
    """
    try:
        tids = {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()
    return tids - {t.native_id for t in threading.enumerate()}


def _renice(tids: set[int], nice: int) -> None:
    """Lower the priority of the burst pool's own threads below the preprocessing workers' (Linux only).

    A worker that wakes up while a burst batch runs then takes the core back; ONNX Runtime's calling thread
    picks up the chunks the starved pool thread has not started.
    """
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), nice))


class _OrtEngine(Engine):
    PROVIDER: ClassVar[str] = ""
    DEPENDENCIES: ClassVar[dict[str, str]] = {"onnxruntime": "ONNX Runtime (the [cpu] or [gpu] extra)"}

    #: Whether a second, wider session may run batches while preprocessing is idle (the CPU provider only).
    BURSTS: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: Any = None
        self._wide: Any = None  # the burst session (burst_threads intra-op threads), CPU only
        self._burst_threads = 0  # its intra-op threads
        self._burst = False
        self.burst_batches = 0  # batches run on the burst session
        self.burst_tids: set[int] = set()
        self._actual_provider = "not loaded"

    @classmethod
    def why_unavailable(cls) -> str | None:
        """Return why this provider cannot run here (found by trying it), or None."""
        return probe_provider(cls.PROVIDER)

    @property
    def backend(self) -> str:
        """``onnxruntime:<provider that actually runs>``."""
        return f"onnxruntime:{self._actual_provider}"

    def _session_options(self, threads: int | None = None) -> Any:
        ort = _ort()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.intra_op_num_threads = threads or int(self.options.get("intra_op_threads", 1))
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        # A burst pool must not spin on cores the workers need a moment later.
        if threads is not None or not self.options.get("allow_spinning", True):
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for key, value in self.artifact.session_config.items():
            so.add_session_config_entry(key, value)
        return so

    def _providers(self) -> list[Any]:
        return [self.PROVIDER]

    def load(self) -> None:
        """Create the session and check which provider actually runs."""
        both = check_distributions()
        if both:
            raise BackendUnavailable(both)
        ort = _ort()
        try:
            self._session = ort.InferenceSession(
                str(self.artifact.path), sess_options=self._session_options(), providers=self._providers()
            )
        except Exception as e:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
            raise BackendUnavailable(f"onnxruntime could not load {self.artifact.path} on {self.PROVIDER}: {e}") from e
        self._actual_provider = self._session.get_providers()[0]
        if self._actual_provider != self.PROVIDER:
            self._session = None
            raise BackendUnavailable(
                f"asked onnxruntime for {self.PROVIDER} but it runs {self._actual_provider} (a silent fallback)"
            )
        inputs = {i.name: i for i in self._session.get_inputs()}
        if self.input_name not in inputs:
            raise BackendUnavailable(
                f"{self.artifact.path}: input {self.input_name!r} from the manifest is not in the graph "
                f"(graph inputs: {sorted(inputs)})"
            )
        shape = list(inputs[self.input_name].shape)
        expected = [self.batch_size, *self.item_shape]
        if shape != expected:
            raise BackendUnavailable(
                f"{self.artifact.path}: graph input shape {shape} != manifest {expected} (the batch must be fixed)"
            )
        burst = int(self.options.get("burst_threads", 1)) or usable_cores()  # 0 = every core this process may use
        if self.BURSTS and burst > int(self.options.get("intra_op_threads", 1)):
            before = _native_threads()
            self._wide = ort.InferenceSession(str(self.artifact.path), sess_options=self._session_options(burst),
                                              providers=self._providers())
            self.burst_tids = _native_threads() - before  # the burst pool's own threads
            self._burst_threads = burst
            below = int(self.options.get("worker_nice", 0)) + BURST_NICE_GAP  # relative, as the workers' os.nice
            _renice(self.burst_tids, min(19, os.getpriority(os.PRIO_PROCESS, 0) + below))
        self._bind()
        log.info("engine loaded: %s %s on %s%s", self.manifest.name, self.precision, self.backend,
                 f" (burst: {burst} threads while preprocessing leaves cores idle)" if self._wide is not None else "")

    def set_burst(self, on: bool) -> None:
        """Run the next batches on the burst session when there is one (see :meth:`Engine.set_burst`)."""
        self._burst = on and self._wide is not None

    def warmup(self, runs: int = 2) -> None:
        """Warm the session up, and the burst session with one batch (not counted in ``burst_batches``)."""
        super().warmup(runs)
        if self._wide is not None:
            self.set_burst(True)
            try:
                super().warmup(1)
            finally:
                self.set_burst(False)
                self.burst_batches = 0

    def _bind(self) -> None:
        """Hook for backends that bind device buffers after the session exists."""

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if self._session is None:
            raise EngineDeadError("engine not loaded")
        session = self._wide if self._burst else self._session
        try:
            values = session.run(list(self.output_names), {self.input_name: batch})
            self.burst_batches += self._burst
        except Exception as e:  # ORT runtime failure of this batch
            raise EngineError(f"onnxruntime run failed: {e}") from e
        return dict(zip(self.output_names, values, strict=True))

    def close(self) -> None:
        """Drop the sessions."""
        self._session = self._wide = None


class OrtCpuEngine(_OrtEngine):
    """ONNX Runtime on the CPU: the embedded default and the reference implementation."""

    name = "onnxruntime-cpu"
    PROVIDER = "CPUExecutionProvider"
    BURSTS = True

    def host_cores(self) -> int:
        """The burst session's threads while bursting, else the normal session's intra-op threads."""
        return self._burst_threads if self._burst else int(self.options.get("intra_op_threads", 1))


class _OrtGpuEngine(_OrtEngine):
    DEPENDENCIES: ClassVar[dict[str, str]] = {
        "onnxruntime-gpu": "ONNX Runtime with CUDA (the [gpu] extra; never together with onnxruntime)",
        "cuda-bindings": "the CUDA runtime binding used to probe the driver and device (the [gpu] extra)",
    }

    def _session_options(self, threads: int | None = None) -> Any:
        so = super()._session_options(threads)
        # Fail instead of silently placing nodes on the CPU (docs/gpu.md).
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return so


class OrtCudaOptions(EngineOptionsSchema, frozen=True):
    """``[engine.options]`` of the ``onnxruntime-cuda`` backend."""

    device_id: DeviceId = 0  # CUDA device
    cuda_graph: bool = True  # replay each batch through a captured CUDA graph
    gpu_mem_limit: Annotated[int, Meta(ge=1 << 20, le=1 << 50)] | None = None  # the CUDA arena's cap; unset = none


class OrtTensorrtOptions(EngineOptionsSchema, frozen=True):
    """``[engine.options]`` of the ``onnxruntime-tensorrt`` backend."""

    precision: Precision = "w4a16"  # the artifact TensorRT builds from ("w4a16" or "fp16")
    device_id: DeviceId = 0  # CUDA device
    workspace_bytes: WorkspaceBytes = 2 << 30  # builder workspace
    optimization_level: OptimizationLevel = 3  # TensorRT builder optimisation level
    cuda_graph: bool = True  # let the provider capture and replay a CUDA graph


class OrtCudaEngine(_OrtGpuEngine):
    """ONNX Runtime on CUDA with fixed device buffers (IOBinding) replayed through a CUDA graph."""

    name = "onnxruntime-cuda"
    PROVIDER = "CUDAExecutionProvider"
    OPTIONS: ClassVar[type[EngineOptionsSchema]] = OrtCudaOptions
    #: Where the bound buffers live (tests bind on "cpu" to exercise the binding path without a GPU).
    BIND_DEVICE: ClassVar[str] = "cuda"

    def _providers(self) -> list[Any]:
        opts = {
            "device_id": str(int(self.options.get("device_id", 0))),
            "enable_cuda_graph": "1" if self.options.get("cuda_graph", True) else "0",
            "cudnn_conv_algo_search": "HEURISTIC",
            "arena_extend_strategy": "kSameAsRequested",
            "do_copy_in_default_stream": "1",
        }
        if "gpu_mem_limit" in self.options:
            opts["gpu_mem_limit"] = str(int(self.options["gpu_mem_limit"]))
        return [(self.PROVIDER, opts)]

    def _bind(self) -> None:
        try:
            self._bind_buffers()
        except Exception as e:  # ORT's own exception types: the device buffers cannot be made
            self._session = None
            raise BackendUnavailable(f"onnxruntime could not bind {self.BIND_DEVICE} buffers: {e}") from e

    def _bind_buffers(self) -> None:
        ort = _ort()
        device = int(self.options.get("device_id", 0))
        self._input = ort.OrtValue.ortvalue_from_numpy(
            np.zeros((self.batch_size, *self.item_shape), np.float32), self.BIND_DEVICE, device)
        self._outputs = {o.name: ort.OrtValue.ortvalue_from_shape_and_type(list(o.shape), np.float32,
                                                                           self.BIND_DEVICE, device)
                         for o in self.manifest.outputs}
        self._binding = self._session.io_binding()
        self._binding.bind_ortvalue_input(self.input_name, self._input)
        for name, value in self._outputs.items():
            self._binding.bind_ortvalue_output(name, value)

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if self._session is None:
            raise EngineDeadError("engine not loaded")
        try:
            self._input.update_inplace(batch)  # same device address every run: the CUDA graph replays
            self._session.run_with_iobinding(self._binding)
            return {name: value.numpy() for name, value in self._outputs.items()}
        except Exception as e:
            raise EngineError(f"onnxruntime CUDA run failed: {e}") from e


class OrtTensorrtEngine(_OrtGpuEngine):
    """ONNX Runtime's TensorRT provider (TensorRT 10 libraries), with its engine and timing caches.

    Runs the W4A16 artifact by default (option ``precision``); the CUDA provider is listed second so nodes
    TensorRT rejects run on CUDA, never on the CPU. The provider (onnxruntime-gpu 1.31) builds weakly typed
    networks, so ``trt_fp16_enable`` is set; the direct ``tensorrt`` backend is the strongly typed one.
    """

    name = "onnxruntime-tensorrt"
    PROVIDER = "TensorrtExecutionProvider"
    OPTIONS: ClassVar[type[EngineOptionsSchema]] = OrtTensorrtOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        precision = self.options.get("precision", "w4a16")
        if precision in self.manifest.artifacts:
            self.artifact = self.manifest.artifact(precision)

    @classmethod
    def why_unavailable(cls) -> str | None:
        """Return why the TensorRT provider (and the CUDA provider behind it) cannot run here, or None."""
        return probe_provider(cls.PROVIDER) or probe_provider("CUDAExecutionProvider")

    def _providers(self) -> list[Any]:
        from appliance.engines.trt_build import default_cache_dir

        cache = Path(self.options.get("cache_dir") or default_cache_dir()) / "ort-trt"
        cache.mkdir(parents=True, exist_ok=True)
        trt_opts = {
            "device_id": str(int(self.options.get("device_id", 0))),
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(cache),
            "trt_engine_cache_prefix": f"{self.manifest.name}-{self.artifact.precision}-{self.artifact.sha256[:12]}",
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": str(cache),
            "trt_max_workspace_size": str(int(self.options.get("workspace_bytes", 2 << 30))),
            "trt_builder_optimization_level": str(int(self.options.get("optimization_level", 3))),
            "trt_cuda_graph_enable": "True" if self.options.get("cuda_graph", True) else "False",
            # This provider builds weakly typed TensorRT 10 networks (it has no strongly typed option), where
            # FP16 layers need the FP16 flag; the graph's own FLOAT16 tensors and INT4 DQ still set the types.
            "trt_fp16_enable": "True",
        }
        return [(self.PROVIDER, trt_opts), ("CUDAExecutionProvider", {"device_id": trt_opts["device_id"]})]
