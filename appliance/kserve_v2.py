"""A minimal KServe v2 (Triton) gRPC client for the bench's peer: ServerReady, ModelReady, ModelInfer.

The bench drives a Triton peer with the same client load as the appliance, from the same process. tritonclient
pins ``protobuf<7`` and the appliance's stubs need ``>=7.35``, so the three messages the bench needs are
built here at import time from a hand-written descriptor (field numbers of ``inference.GRPCInferenceService``
in triton-inference-server/common ``grpc_service.proto``; maps and typed ``contents`` are left out, which
protobuf skips as unknown fields). BYTES tensors go in ``raw_input_contents``: each element is a little-endian
uint32 length followed by the bytes, as tritonclient writes them.
"""

from __future__ import annotations

import struct
from typing import Any

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["SERVICE", "KServeV2", "encode_bytes_tensor"]

SERVICE = "inference.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BOOL, _INT64, _BYTES, _MSG = _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_INT64, _F.TYPE_BYTES, _F.TYPE_MESSAGE
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _message(parent: Any, name: str, fields: list[tuple[str, int, int, int, str]]) -> Any:
    msg = parent.add(name=name)
    for fname, number, ftype, label, type_name in fields:
        f = msg.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name
    return msg


def _build() -> dict[str, type]:
    fd = descriptor_pb2.FileDescriptorProto(name="appliance_kserve_v2_subset.proto", package="inference",
                                            syntax="proto3")
    _message(fd.message_type, "ServerReadyRequest", [])
    _message(fd.message_type, "ServerReadyResponse", [("ready", 1, _BOOL, _OPT, "")])
    _message(fd.message_type, "ModelReadyRequest", [("name", 1, _STRING, _OPT, ""), ("version", 2, _STRING, _OPT, "")])
    _message(fd.message_type, "ModelReadyResponse", [("ready", 1, _BOOL, _OPT, "")])
    req = _message(fd.message_type, "ModelInferRequest", [
        ("model_name", 1, _STRING, _OPT, ""), ("model_version", 2, _STRING, _OPT, ""), ("id", 3, _STRING, _OPT, ""),
        ("inputs", 5, _MSG, _REP, ".inference.ModelInferRequest.InferInputTensor"),
        ("outputs", 6, _MSG, _REP, ".inference.ModelInferRequest.InferRequestedOutputTensor"),
        ("raw_input_contents", 7, _BYTES, _REP, ""),
    ])
    _message(req.nested_type, "InferInputTensor", [
        ("name", 1, _STRING, _OPT, ""), ("datatype", 2, _STRING, _OPT, ""), ("shape", 3, _INT64, _REP, ""),
    ])
    _message(req.nested_type, "InferRequestedOutputTensor", [("name", 1, _STRING, _OPT, "")])
    resp = _message(fd.message_type, "ModelInferResponse", [
        ("model_name", 1, _STRING, _OPT, ""), ("model_version", 2, _STRING, _OPT, ""), ("id", 3, _STRING, _OPT, ""),
        ("outputs", 5, _MSG, _REP, ".inference.ModelInferResponse.InferOutputTensor"),
        ("raw_output_contents", 6, _BYTES, _REP, ""),
    ])
    _message(resp.nested_type, "InferOutputTensor", [
        ("name", 1, _STRING, _OPT, ""), ("datatype", 2, _STRING, _OPT, ""), ("shape", 3, _INT64, _REP, ""),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    names = ["ServerReadyRequest", "ServerReadyResponse", "ModelReadyRequest", "ModelReadyResponse",
             "ModelInferRequest", "ModelInferResponse"]
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{n}")) for n in names}


_MESSAGES = _build()
_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8}


def encode_bytes_tensor(items: list[bytes]) -> bytes:
    """Serialise a BYTES tensor for ``raw_input_contents``: (uint32 LE length, bytes) per element."""
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


class KServeV2:
    """Async calls on one ``grpc.aio`` channel: ``ready()`` and ``infer_dicom()`` (one file per request)."""

    def __init__(self, channel: grpc.aio.Channel, model: str, input_name: str = "dicom") -> None:
        m = _MESSAGES
        self.model, self.input_name = model, input_name
        self._server_ready = channel.unary_unary(
            f"/{SERVICE}/ServerReady", request_serializer=m["ServerReadyRequest"].SerializeToString,
            response_deserializer=m["ServerReadyResponse"].FromString)
        self._model_ready = channel.unary_unary(
            f"/{SERVICE}/ModelReady", request_serializer=m["ModelReadyRequest"].SerializeToString,
            response_deserializer=m["ModelReadyResponse"].FromString)
        self._infer = channel.unary_unary(
            f"/{SERVICE}/ModelInfer", request_serializer=m["ModelInferRequest"].SerializeToString,
            response_deserializer=m["ModelInferResponse"].FromString)

    async def ready(self, timeout: float = 2.0) -> bool:
        """True when the server and the model are ready."""
        server = await self._server_ready(_MESSAGES["ServerReadyRequest"](), timeout=timeout)
        if not server.ready:
            return False
        model = await self._model_ready(_MESSAGES["ModelReadyRequest"](name=self.model), timeout=timeout)
        return bool(model.ready)

    async def infer_dicom(self, data: bytes, request_id: str = "", timeout: float = 30.0) -> dict[str, np.ndarray]:
        """Send one DICOM file as a [1, 1] BYTES tensor; return the outputs by name (batch dim kept)."""
        req = _MESSAGES["ModelInferRequest"](model_name=self.model, id=request_id)
        req.inputs.add(name=self.input_name, datatype="BYTES", shape=[1, 1])
        req.raw_input_contents.append(encode_bytes_tensor([data]))
        resp = await self._infer(req, timeout=timeout)
        out: dict[str, np.ndarray] = {}
        for tensor, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
            dtype = _DTYPES.get(tensor.datatype)
            if dtype is None:
                raise ValueError(f"unsupported output datatype {tensor.datatype!r} for {tensor.name!r}")
            out[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.shape))
        return out
