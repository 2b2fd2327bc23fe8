"""Remote engine: each fixed batch runs on a Triton Inference Server (or any KServe v2 gRPC server).

Scale-out without a home-made cluster (docs/scale-out.md): the appliance keeps DICOM handling, admission,
batching and the thermal governor local and sends each preprocessed ``[B, *item_shape]`` float32 batch to
the hospital's Triton over the Open Inference Protocol.

It speaks the protocol through the project's own ``inference`` stubs (appliance/proto/inference), which are
wire-compatible with Triton's, instead of ``tritonclient``: tritonclient needs ``protobuf<7`` while the
daemon's stubs need ``protobuf>=7.35``, so the two cannot share one environment. No extra package needed.

Options (``[engine] options = {...}`` in the config):

- ``url`` (required): ``host:port`` of Triton's gRPC endpoint (8001 by default on Triton).
- ``model_name`` (default: the manifest's name), ``model_version`` (default ``""``: the server's choice).
- ``timeout_s`` (default 10): deadline of one batch; a miss fails that batch (EngineError), not the engine.
- ``load_timeout_s`` (default 60): how long ``load()`` waits for the remote model to be ready.

``load()`` checks the remote model against the manifest (input name, FP32, item shape, batch dimension,
outputs) so a mismatch fails at start with a message naming both sides.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, ClassVar

import grpc
import numpy as np
from msgspec import Meta

from appliance.engines.base import Engine, EngineOptionsSchema
from appliance.errors import BackendUnavailable, ConfigError, EngineError

__all__ = ["TritonEngine", "TritonOptions"]

log = logging.getLogger(__name__)

_MAX_MESSAGE = 256 << 20


def _stubs() -> tuple[Any, Any]:
    from appliance.proto.inference import grpc_service_pb2, grpc_service_pb2_grpc

    return grpc_service_pb2, grpc_service_pb2_grpc


class TritonOptions(EngineOptionsSchema, frozen=True):
    """``[engine.options]`` of the triton backend (``backend = "triton"``)."""

    url: str = ""  # host:port of the remote Triton / KServe v2 gRPC endpoint (required to load)
    model_name: str = ""  # remote model name; "" = the manifest's
    model_version: str = ""  # remote model version; "" = any
    timeout_s: Annotated[float, Meta(ge=0.001, le=3600.0)] = 10.0  # deadline of one batch
    # How long load() waits for the remote model to be ready.
    load_timeout_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 60.0


class TritonEngine(Engine):
    """Runs each batch on a remote Triton over KServe v2 gRPC. Never chosen by ``auto``."""

    name = "triton"
    DEPENDENCIES: ClassVar[dict[str, str]] = {}  # grpcio and the vendored stubs are core dependencies
    OPTIONS: ClassVar[type[EngineOptionsSchema]] = TritonOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.url = str(self.options.get("url", ""))
        self.model_name = str(self.options.get("model_name") or self.manifest.name)
        self.model_version = str(self.options.get("model_version", ""))
        self.timeout_s = float(self.options.get("timeout_s", 10.0))
        self.load_timeout_s = float(self.options.get("load_timeout_s", 60.0))
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._server = "not loaded"

    @property
    def backend(self) -> str:
        """``triton:<server name> <version>@<url>/<model>``."""
        return f"triton:{self._server}@{self.url}/{self.model_name}"

    def load(self) -> None:
        """Connect, wait for the remote model to be ready, and check it against the manifest."""
        if not self.url:
            raise ConfigError("the triton backend needs a server address: config key engine.options.url is empty")
        pb, pb_grpc = _stubs()
        self._channel = grpc.insecure_channel(
            self.url,
            options=[
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ],
        )
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        deadline = time.monotonic() + self.load_timeout_s
        last = "no answer"
        while True:
            try:
                request = pb.ModelReadyRequest(name=self.model_name, version=self.model_version)
                if self._stub.ModelReady(request, timeout=2.0).ready:
                    break
                last = f"model {self.model_name!r} not ready"
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"triton at {self.url} (config key engine.options.url): {last} after {self.load_timeout_s:.0f} s"
                )
            time.sleep(0.2)
        try:
            server = self._stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=5.0)
            meta = self._stub.ModelMetadata(
                pb.ModelMetadataRequest(name=self.model_name, version=self.model_version), timeout=5.0
            )
        except grpc.RpcError as e:
            raise BackendUnavailable(f"triton at {self.url}: metadata failed: {e.code().name}: {e.details()}") from e
        self._server = f"{server.name} {server.version}".strip()
        self._check(meta)
        log.info("engine loaded: %s on %s", self.manifest.name, self.backend)

    def _check(self, meta: Any) -> None:
        where = f"triton model {self.model_name!r} at {self.url}"
        inputs = {t.name: t for t in meta.inputs}
        if self.input_name not in inputs:
            raise BackendUnavailable(f"{where}: no input {self.input_name!r} (has {sorted(inputs)})")
        tensor = inputs[self.input_name]
        shape = list(tensor.shape)
        if tensor.datatype != "FP32" or shape[1:] != list(self.item_shape) or shape[0] not in (-1, self.batch_size):
            raise BackendUnavailable(
                f"{where}: input {tensor.name!r} is {tensor.datatype} {shape}, the manifest needs FP32 "
                f"[{self.batch_size}, {', '.join(map(str, self.item_shape))}]"
            )
        missing = [name for name in self.output_names if name not in {t.name for t in meta.outputs}]
        if missing:
            raise BackendUnavailable(f"{where}: outputs {missing} of the manifest are not served")

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if self._stub is None:
            raise EngineError("triton engine not loaded")
        pb, _ = _stubs()
        request = pb.ModelInferRequest(model_name=self.model_name, model_version=self.model_version)
        request.inputs.add(name=self.input_name, datatype="FP32", shape=batch.shape)
        request.outputs.extend(pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in self.output_names)
        request.raw_input_contents.append(np.ascontiguousarray(batch, dtype="<f4").tobytes())
        try:
            response = self._stub.ModelInfer(request, timeout=self.timeout_s)
        except grpc.RpcError as e:  # one failed batch; the next may succeed (server restart, network blip)
            raise EngineError(f"triton at {self.url}: {e.code().name}: {e.details()}") from e
        if len(response.raw_output_contents) != len(response.outputs):
            raise EngineError(f"triton at {self.url}: outputs not in raw_output_contents")
        outputs: dict[str, np.ndarray] = {}
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            if tensor.name not in self.output_names:
                continue
            if tensor.datatype != "FP32":
                raise EngineError(f"triton output {tensor.name!r} is {tensor.datatype}, expected FP32")
            outputs[tensor.name] = np.frombuffer(raw, dtype="<f4").reshape(tuple(tensor.shape)).astype(np.float32)
        missing = set(self.output_names) - set(outputs)
        if missing:
            raise EngineError(f"triton at {self.url}: response lacks outputs {sorted(missing)}")
        return outputs

    def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
