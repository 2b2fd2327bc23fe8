"""A fake ``tensorrt`` module: the names the TensorRT backend uses, with TensorRT 10's Python API shapes.

tests/gpu/test_gpu_fakes_conformance.py checks that every public name here (and every ``trt.X`` the backend
uses) exists in the real ``tensorrt`` bindings, read from the wheel's shared library. Behaviour modelled:

* ``OnnxParser.parse`` reads the graph (with ``onnx``: a dev dependency, imported only here) and fails like
  the real parser on bytes that are not ONNX;
* ``Builder.build_serialized_network`` reports phases to ``config.progress_monitor``, honours the
  strongly typed flag (a weakly typed network without precision flags builds FP32, as TensorRT would) and
  returns a "plan" that embeds the graph; :data:`STATE` can make it drop INT4 (a silent FP32 build), change
  an output, or fail;
* ``Runtime.deserialize_cuda_engine`` returns None for bytes that are not a plan of this version;
* the inspector's JSON names each tensor's format as TensorRT 10 does ("Row major linear FP16 format"; the
  INT4 wording is assumed, docs/gpu.md section 10);
* ``execute_async_v3`` enqueues, on the fake CUDA stream (:mod:`appliance.engines.fake_cudart`), a kernel
  that reads the input at the tensor addresses set *at enqueue time* (so CUDA-graph capture bakes them in)
  and writes ONNX Runtime CPU's outputs for the embedded graph: the fake engine computes what ORT computes.
"""

from __future__ import annotations

import ctypes
import enum
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "STATE",
    "Builder",
    "BuilderFlag",
    "DataType",
    "HardwareCompatibilityLevel",
    "IHostMemory",
    "IProgressMonitor",
    "LayerInformationFormat",
    "Logger",
    "MemoryPoolType",
    "NetworkDefinitionCreationFlag",
    "OnnxParser",
    "ProfilingVerbosity",
    "Runtime",
    "TensorIOMode",
    "reset",
]

__version__ = "10.13.3.9"
_MAGIC = b"FAKETRTPLAN1\n"


@dataclass
class FakeTrt:
    """Knobs and counters."""

    drop_int4: bool = False  # build without INT4 weights (a silent FP32 build)
    output_shape_override: dict[str, tuple[int, ...]] = field(default_factory=dict)
    fail_build: bool = False
    builds: int = 0
    executes: int = 0
    configs: list[dict[str, Any]] = field(default_factory=list)  # builder settings of each build


STATE = FakeTrt()


def reset(**kwargs: Any) -> FakeTrt:
    """Install and return fresh knobs/counters."""
    global STATE
    STATE = FakeTrt(**kwargs)
    return STATE


class DataType(enum.IntEnum):
    """Tensor element types (values as in NvInferRuntimeBase.h)."""

    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    INT4 = 9


class TensorIOMode(enum.IntEnum):
    """I/O mode of a tensor."""

    NONE = 0
    INPUT = 1
    OUTPUT = 2


class NetworkDefinitionCreationFlag(enum.IntEnum):
    """Network flags (EXPLICIT_BATCH is gone in TensorRT 11 and unused here)."""

    STRONGLY_TYPED = 1


class MemoryPoolType(enum.IntEnum):
    """Memory pools."""

    WORKSPACE = 0


class HardwareCompatibilityLevel(enum.IntEnum):
    """Hardware compatibility."""

    NONE = 0
    AMPERE_PLUS = 1
    SAME_COMPUTE_CAPABILITY = 2


class ProfilingVerbosity(enum.IntEnum):
    """Inspector detail."""

    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class LayerInformationFormat(enum.IntEnum):
    """Inspector output format."""

    ONELINE = 0
    JSON = 1


class BuilderFlag(enum.IntEnum):
    """Builder flags this backend may set (no precision flags: TensorRT 11 removed them)."""

    VERSION_COMPATIBLE = 13  # its value in TensorRT 10.13-10.16 (12 in 11.x)


class Logger:
    """Logger with the real severities."""

    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self, min_severity: int = 2) -> None:
        self.min_severity = min_severity


class IProgressMonitor:
    """Base class of build progress monitors (subclasses call ``IProgressMonitor.__init__(self)``)."""

    def __init__(self) -> None:
        pass

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        """A build phase starts (subclasses override)."""
        raise NotImplementedError

    def step_complete(self, phase_name: str, step: int) -> bool:
        """A step of a phase is done; False cancels the build (subclasses override)."""
        raise NotImplementedError

    def phase_finish(self, phase_name: str) -> None:
        """A build phase ends (subclasses override)."""
        raise NotImplementedError


def _graph_facts(data: bytes) -> dict[str, Any]:
    import onnx

    model = onnx.load_from_string(data)
    g = model.graph
    inits = {t.name for t in g.initializer}
    elem = {onnx.TensorProto.FLOAT: "FLOAT", onnx.TensorProto.FLOAT16: "HALF"}

    def spec(vi: Any) -> dict[str, Any]:
        t = vi.type.tensor_type
        return {"name": vi.name, "shape": [d.dim_value for d in t.shape.dim], "dtype": elem.get(t.elem_type, "?")}

    types = {t.data_type for t in g.initializer}
    return {"inputs": [spec(i) for i in g.input if i.name not in inits], "outputs": [spec(o) for o in g.output],
            "int4": onnx.TensorProto.INT4 in types, "fp16": onnx.TensorProto.FLOAT16 in types}


class _Network:
    def __init__(self, flags: int) -> None:
        self.strongly_typed = bool(flags & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)))
        self.facts: dict[str, Any] | None = None
        self.onnx = b""


class OnnxParser:
    """Parses an ONNX graph into a network."""

    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network
        self.errors: list[str] = []

    def parse(self, model: bytes, path: str | None = None) -> bool:
        """Parse; False (with errors) if the bytes are not a valid ONNX graph (``path``: for external weights)."""
        try:
            self.network.facts = _graph_facts(bytes(model))
        except Exception as e:  # noqa: BLE001 - the real parser reports, never raises
            self.errors.append(f"ModelImporter: failed to parse ONNX: {type(e).__name__}")
            return False
        self.network.onnx = bytes(model)
        return True

    @property
    def num_errors(self) -> int:
        """Number of parse errors."""
        return len(self.errors)

    def get_error(self, index: int) -> str:
        """One parse error."""
        return self.errors[index]


class IHostMemory:
    """A buffer TensorRT allocated, as the real one: ``bytes(m)`` and ``nbytes``, but no ``len()``.

    A ``len(plan)`` would pass on plain bytes here and fail only on a GPU (GPU code review, session 19).
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.nbytes = len(data)

    def __bytes__(self) -> bytes:
        return self._data


class _TimingCache:
    def __init__(self, data: bytes) -> None:
        self.data = data or b"fake-timing-cache"

    def serialize(self) -> IHostMemory:
        return IHostMemory(self.data + b"+")


class _Config:
    def __init__(self) -> None:
        self.pools: dict[int, int] = {}
        self.builder_optimization_level = 3
        self.hardware_compatibility_level = HardwareCompatibilityLevel.NONE
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.progress_monitor: IProgressMonitor | None = None
        self.flags: set[int] = set()
        self.timing_cache: _TimingCache | None = None

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        self.pools[int(pool)] = int(pool_size)

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(int(flag))

    def create_timing_cache(self, serialized_timing_cache: bytes) -> _TimingCache:
        return _TimingCache(bytes(serialized_timing_cache))

    def set_timing_cache(self, cache: _TimingCache, ignore_mismatch: bool) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> _TimingCache | None:
        return self.timing_cache


class Builder:
    """Builds plans."""

    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> _Network:
        """A network definition."""
        return _Network(flags)

    def create_builder_config(self) -> _Config:
        """A builder configuration."""
        return _Config()

    def build_serialized_network(self, network: _Network, config: _Config) -> IHostMemory | None:
        """Build a plan; None on failure (as the real builder)."""
        STATE.builds += 1
        STATE.configs.append({"workspace": config.pools.get(int(MemoryPoolType.WORKSPACE)),
                              "opt_level": config.builder_optimization_level,
                              "detailed": config.profiling_verbosity == ProfilingVerbosity.DETAILED,
                              "timing_cache": config.timing_cache is not None,
                              "strongly_typed": network.strongly_typed})
        monitor = config.progress_monitor
        if monitor is not None:
            monitor.phase_start("Building engine", None, 3)
            for step in range(3):
                monitor.step_complete("Building engine", step)
            monitor.phase_finish("Building engine")
        if STATE.fail_build or network.facts is None:
            return None
        facts = json.loads(json.dumps(network.facts))
        for out in facts["outputs"]:
            if out["name"] in STATE.output_shape_override:
                out["shape"] = list(STATE.output_shape_override[out["name"]])
        facts["int4"] = facts["int4"] and not STATE.drop_int4 and network.strongly_typed
        facts["fp16"] = facts["fp16"] and network.strongly_typed  # weak typing without flags: FP32
        header = json.dumps({"version": __version__, "facts": facts}).encode()
        return IHostMemory(_MAGIC + len(header).to_bytes(4, "little") + header + network.onnx)


class Runtime:
    """Deserializes plans."""

    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> _Engine | None:
        """The engine, or None if the bytes are not a plan of this TensorRT version (as the real runtime)."""
        data = bytes(serialized_engine)
        if not data.startswith(_MAGIC):
            return None
        try:
            n = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 4], "little")
            header = json.loads(data[len(_MAGIC) + 4:len(_MAGIC) + 4 + n])
            onnx_bytes = data[len(_MAGIC) + 4 + n:]
        except ValueError:
            return None
        if header.get("version") != __version__ or not onnx_bytes:
            return None
        try:
            _graph_facts(onnx_bytes)
        except Exception:  # noqa: BLE001 - a truncated plan
            return None
        return _Engine(header["facts"], onnx_bytes)


class _Engine:
    def __init__(self, facts: dict[str, Any], onnx_bytes: bytes) -> None:
        self.facts, self.onnx = facts, onnx_bytes
        self.io: dict[str, tuple[TensorIOMode, dict[str, Any]]] = {
            t["name"]: (TensorIOMode.INPUT, t) for t in facts["inputs"]}
        self.io.update({t["name"]: (TensorIOMode.OUTPUT, t) for t in facts["outputs"]})
        self._session: Any = None

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, index: int) -> str:
        return list(self.io)[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.io[name][0]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.io[name][1]["shape"])

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[self.io[name][1]["dtype"]] if self.io[name][1]["dtype"] in ("FLOAT", "HALF") else DataType.INT8

    def create_engine_inspector(self) -> _Inspector:
        return _Inspector(self.facts)

    def create_execution_context(self) -> _Context:
        return _Context(self)

    def session(self) -> Any:
        if self._session is None:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = 1
            so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
            self._session = ort.InferenceSession(self.onnx, so, providers=["CPUExecutionProvider"])
        return self._session


class _Inspector:
    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts

    def get_engine_information(self, format: LayerInformationFormat) -> str:  # noqa: A002 - the real name
        act = "Row major linear FP16 format" if self.facts["fp16"] else "Row major linear FP32 format"
        layers = [{"Name": "input_cast", "LayerType": "Reformat", "Outputs": [{"Format/Datatype": act}]}]
        if self.facts["int4"]:
            layers.append({"Name": "weights_dq", "LayerType": "Constant",
                           "Outputs": [{"Format/Datatype": "Row major linear Int4 format"}]})
        layers.append({"Name": "gemm", "LayerType": "Gemm", "Inputs": [{"Format/Datatype": act}],
                       "Outputs": [{"Format/Datatype": act}]})
        return json.dumps({"Layers": layers, "Bindings": [t["name"] for t in self.facts["inputs"] +
                                                          self.facts["outputs"]]})


class _Context:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.addresses: dict[str, int] = {}

    def set_tensor_address(self, name: str, memory: int) -> bool:
        if name not in self.engine.io:
            return False
        self.addresses[name] = int(memory)
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue the whole network on the stream, reading/writing the addresses set now."""
        from appliance.engines import fake_cudart

        addresses = dict(self.addresses)
        if set(addresses) != set(self.engine.io):
            return False
        engine = self.engine

        def kernel() -> None:
            STATE.executes += 1
            feeds = {}
            for t in engine.facts["inputs"]:
                n = int(np.prod(t["shape"]))
                arr = np.ctypeslib.as_array((ctypes.c_float * n).from_address(addresses[t["name"]]))
                feeds[t["name"]] = arr.reshape(t["shape"]).copy()
            names = [t["name"] for t in engine.facts["outputs"]]
            for name, value in zip(names, engine.session().run(names, feeds), strict=True):
                out = np.ascontiguousarray(value, dtype=np.float32)
                ctypes.memmove(addresses[name], out.ctypes.data, out.nbytes)

        return fake_cudart.enqueue(stream_handle, "trt", kernel) == fake_cudart.cudaError_t.cudaSuccess
