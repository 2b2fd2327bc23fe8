"""A minimal KServe v2 (Triton) gRPC client for the bench's peer: ServerReady, ModelReady, ModelInfer.

The bench drives a Triton peer with the same client load as the appliance, from the same process, with the
committed Open Inference Protocol stubs (``appliance.proto.inference``; tritonclient pins ``protobuf<7``, so it
cannot live in this venv). BYTES tensors go in ``raw_input_contents``: each element is a little-endian uint32
length followed by the bytes, as tritonclient writes them.
"""

from __future__ import annotations

import grpc
import numpy as np

from appliance.proto.inference import grpc_service_pb2 as oip
from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc
from appliance.serving.oip_wire import serialize_bytes as encode_bytes_tensor

__all__ = ["KServeV2", "encode_bytes_tensor"]

_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8}


class KServeV2:
    """Async calls on one ``grpc.aio`` channel: ``ready()`` and ``infer_dicom()`` (one file per request)."""

    def __init__(self, channel: grpc.aio.Channel, model: str, input_name: str = "dicom") -> None:
        self.model, self.input_name = model, input_name
        self._stub = oip_grpc.GRPCInferenceServiceStub(channel)

    async def ready(self, timeout: float = 2.0) -> bool:
        """True when the server and the model are ready."""
        server = await self._stub.ServerReady(oip.ServerReadyRequest(), timeout=timeout)
        if not server.ready:
            return False
        model = await self._stub.ModelReady(oip.ModelReadyRequest(name=self.model), timeout=timeout)
        return bool(model.ready)

    async def infer_dicom(self, data: bytes, request_id: str = "", timeout: float = 30.0) -> dict[str, np.ndarray]:
        """Send one DICOM file as a [1, 1] BYTES tensor; return the outputs by name (batch dim kept)."""
        req = oip.ModelInferRequest(model_name=self.model, id=request_id)
        req.inputs.add(name=self.input_name, datatype="BYTES", shape=[1, 1])
        req.raw_input_contents.append(encode_bytes_tensor([data]))
        resp = await self._stub.ModelInfer(req, timeout=timeout)
        out: dict[str, np.ndarray] = {}
        for tensor, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
            dtype = _DTYPES.get(tensor.datatype)
            if dtype is None:
                raise ValueError(f"unsupported output datatype {tensor.datatype!r} for {tensor.name!r}")
            out[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.shape))
        return out
