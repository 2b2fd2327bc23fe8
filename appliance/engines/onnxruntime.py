"""ONNX Runtime backends: CPU (the embedded default) and CUDA.

Session settings follow notes/engines.md §8–9: ``ORT_ENABLE_ALL`` (fuses INT4 DQ->MatMul into MatMulNBits),
``ORT_SEQUENTIAL``, one inter-op thread, and intra-op threads = the cores not used by DICOM decoding (1 on a
small box: two threads on a shared core are 1.6-2.2x slower than one). ORT falls back to the CPU silently
(§7), so after creating the session we compare the provider that actually runs with the one we asked for.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from appliance.engines.base import Engine
from appliance.errors import BackendUnavailable, EngineDeadError, EngineError

__all__ = ["OrtCpuEngine", "OrtCudaEngine"]

log = logging.getLogger(__name__)


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


class _OrtEngine(Engine):
    PROVIDER: ClassVar[str] = ""
    DEPENDENCIES: ClassVar[dict[str, str]] = {"onnxruntime": "ONNX Runtime (the [cpu] or [gpu] extra)"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: Any = None
        self._actual_provider = "not loaded"

    @classmethod
    def why_unavailable(cls) -> str | None:
        """Return why this provider cannot run here, or None."""
        try:
            ort = _ort()
        except ImportError:
            return "requires onnxruntime (pip install 'edge-appliance[cpu]') or onnxruntime-gpu ([gpu])"
        if cls.PROVIDER not in ort.get_available_providers():
            return f"{cls.PROVIDER} is not in this onnxruntime build ({', '.join(ort.get_available_providers())})"
        return None

    @property
    def backend(self) -> str:
        """``onnxruntime:<provider that actually runs>``."""
        return f"onnxruntime:{self._actual_provider}"

    def _session_options(self) -> Any:
        ort = _ort()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.intra_op_num_threads = int(self.options.get("intra_op_threads", 1))
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        if not self.options.get("allow_spinning", True):
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for key, value in self.artifact.session_config.items():
            so.add_session_config_entry(key, value)
        return so

    def _providers(self) -> list[Any]:
        return [self.PROVIDER]

    def load(self) -> None:
        """Create the session and check which provider actually runs."""
        ort = _ort()
        try:
            self._session = ort.InferenceSession(
                str(self.artifact.path), sess_options=self._session_options(), providers=self._providers()
            )
        except Exception as e:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
            raise BackendUnavailable(f"onnxruntime could not load {self.artifact.path}: {e}") from e
        self._actual_provider = self._session.get_providers()[0]
        if self._actual_provider != self.PROVIDER:
            raise BackendUnavailable(
                f"asked onnxruntime for {self.PROVIDER} but it runs {self._actual_provider} "
                f"(silent fallback, notes/engines.md §7)"
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
        log.info("engine loaded: %s %s on %s", self.manifest.name, self.precision, self.backend)

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if self._session is None:
            raise EngineDeadError("engine not loaded")
        try:
            values = self._session.run(list(self.output_names), {self.input_name: batch})
        except Exception as e:  # ORT runtime failure of this batch
            raise EngineError(f"onnxruntime run failed: {e}") from e
        return dict(zip(self.output_names, values, strict=True))

    def close(self) -> None:
        """Drop the session."""
        self._session = None


class OrtCpuEngine(_OrtEngine):
    """ONNX Runtime on the CPU: the embedded default and the reference implementation."""

    name = "onnxruntime-cpu"
    PROVIDER = "CPUExecutionProvider"


class OrtCudaEngine(_OrtEngine):
    """ONNX Runtime on CUDA (needs the [gpu] extra: onnxruntime-gpu, never together with onnxruntime)."""

    name = "onnxruntime-cuda"
    PROVIDER = "CUDAExecutionProvider"
    DEPENDENCIES: ClassVar[dict[str, str]] = {"onnxruntime-gpu": "ONNX Runtime with CUDA (the [gpu] extra)"}

    def _session_options(self) -> Any:
        so = super()._session_options()
        # Fail instead of silently placing nodes on the CPU (notes/engines.md §7).
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return so
