"""The KServe v2 wire format as this server speaks it.

BYTES tensors, request parameters, outputs, statistics, model metadata and configuration. Pure functions over the
generated ``inference`` messages, no server state; :mod:`appliance.serving.oip` is the servicer that calls them
(docs/oip.md).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.batching.work import Priority
from appliance.errors import InputError
from appliance.privacy import clip
from appliance.proto.inference import grpc_service_pb2 as oip

if TYPE_CHECKING:
    from appliance.serving.analysis import ModelInfo

__all__ = ["PLATFORM", "ViewStats", "deserialize_bytes", "duration", "model_config", "model_metadata",
           "only_typed_field", "refuse_extensions", "response", "schedule", "serialize_bytes", "single_input",
           "wanted_outputs"]

PLATFORM = "edge-appliance"

#: An output's (name, datatype, per-item shape), as a view lists them.
Output = tuple[str, str, tuple[int, ...]]


def serialize_bytes(items: Sequence[bytes]) -> bytes:
    """Encode BYTES elements for raw contents: each as a 4-byte little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def deserialize_bytes(blob: bytes, where: str = "input", limit: int | None = None) -> list[bytes]:
    """Decode raw BYTES contents (see :func:`serialize_bytes`); InputError if a length runs past the end.

    With ``limit``, InputError as soon as there are more elements than that (16 million empty elements took the
    event loop 6 s to decode before their count was compared with the shape).
    """
    items: list[bytes] = []
    offset, view = 0, memoryview(blob)
    while offset < len(view):
        if offset + 4 > len(view):  # before the count: 2 stray bytes after the last element are no element
            raise InputError(f"{where}: truncated BYTES element length at offset {offset}", field=where)
        if limit is not None and len(items) >= limit:
            raise InputError(f"{where}: more BYTES elements than the {limit} its shape declares", field=where)
        (n,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + n > len(view):
            raise InputError(f"{where}: BYTES element of {n} bytes runs past the end of the tensor", field=where)
        items.append(bytes(view[offset : offset + n]))
        offset += n
    return items


def single_input(
    request: oip.ModelInferRequest, expected: str
) -> tuple[oip.ModelInferRequest.InferInputTensor, bytes | None]:
    """The request's one input, which must be named ``expected``, and its raw contents (None: typed contents)."""
    if len(request.inputs) != 1 or request.inputs[0].name != expected:
        got = [clip(t.name) for t in request.inputs[:4]] + ([f"... {len(request.inputs)} in all"]
                                                               if len(request.inputs) > 4 else [])
        raise InputError(f"expected exactly one input named {expected!r}, got {got}", field="inputs")
    if request.raw_input_contents and len(request.raw_input_contents) != 1:
        raise InputError(
            f"{len(request.raw_input_contents)} raw_input_contents for 1 input", field="raw_input_contents"
        )
    raw = request.raw_input_contents[0] if request.raw_input_contents else None
    if raw is not None and request.inputs[0].contents.ListFields():
        raise InputError(f"input {expected!r} has both raw_input_contents and typed contents; send one",
                         field=expected)
    return request.inputs[0], raw


def only_typed_field(tensor: oip.ModelInferRequest.InferInputTensor, field: str) -> None:
    """Refuse typed contents in any field but ``field`` (``fp32_contents`` for FP32, ``bytes_contents`` for BYTES).

    Contents sent in another field read as none at all ("matching its 0 elements"), and extra fields beside the
    right one were ignored (held-out review, session 22).
    """
    sent = [f.name for f, _ in tensor.contents.ListFields()]
    other = [name for name in sent if name != field]
    if other:
        raise InputError(f"input {clip(tensor.name)!r} is {clip(tensor.datatype)}: its typed contents go in {field}, "
                         f"got {', '.join(other)}", field=tensor.name)


def schedule(request: oip.ModelInferRequest, context: Any) -> tuple[Priority, float | None]:
    """Triton's ``priority`` (1 = highest) and ``timeout`` (µs), combined with the gRPC deadline."""
    values: dict[str, int] = {}
    for key in ("priority", "timeout"):
        if key not in request.parameters:
            continue
        param = request.parameters[key]
        kind = param.WhichOneof("parameter_choice")
        if kind not in ("int64_param", "uint64_param"):
            raise InputError(f"parameter {key!r} must be an integer (int64 or uint64)", field=f"parameters.{key}")
        values[key] = int(getattr(param, kind))
        if values[key] < 0:
            raise InputError(f"parameter {key!r} must be >= 0, got {values[key]}", field=f"parameters.{key}")
    priority = Priority.INTERACTIVE if values.get("priority") == 1 else Priority.BATCH
    remaining: float | None = context.time_remaining()
    if values.get("timeout"):
        timeout = values["timeout"] / 1e6
        remaining = timeout if remaining is None else min(remaining, timeout)
    return priority, remaining


def wanted_outputs(request: oip.ModelInferRequest, view: str, names: list[str]) -> list[str]:
    """The requested outputs (all when none are named); unknown or repeated names are refused.

    Linear in the request (a 1.7 MB request naming one output 50,000 times held the event loop for 26 s while
    ``list.count`` looked for repeats, session 18).
    """
    wanted = [o.name for o in request.outputs] or names
    known, seen = set(names), set()
    for w in wanted:
        if w not in known:
            raise InputError(f"unexpected inference output {clip(w)!r} for model {view!r}", field="outputs")
        if w in seen:
            raise InputError(f"inference output {clip(w)!r} is requested more than once", field="outputs")
        seen.add(w)
    return wanted


def response(
    request: oip.ModelInferRequest, view: str, version: str, wanted: list[str], names: list[str],
    tensors: list[np.ndarray],
) -> oip.ModelInferResponse:
    """The answer: the ``wanted`` tensors of ``names`` in ``raw_output_contents``, little-endian."""
    response = oip.ModelInferResponse(model_name=view, model_version=version, id=request.id)
    by_name = dict(zip(names, tensors, strict=True))
    for name in wanted:
        array = by_name[name]
        if array.dtype == object:
            datatype, raw = "BYTES", serialize_bytes(list(array))
        else:
            datatype = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32",
                        np.dtype(np.bool_): "BOOL"}[array.dtype]  # BOOL: one byte per element
            raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        response.outputs.append(
            oip.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=array.shape)
        )
        response.raw_output_contents.append(raw)
    return response


_SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


_SEQUENCE_KEYS = ("sequence_id", "sequence_start", "sequence_end")


def refuse_extensions(request: oip.ModelInferRequest, view: str, dicom_view: str) -> None:
    """Refuse parameters of extensions not offered, and ``pipeline`` where it has no meaning.

    Ignoring them would answer in a form the client did not ask for: raw contents instead of its shared-memory
    region, scores instead of ``value:index`` strings, a stateless answer to a sequence the client believes is kept
    (Triton refuses sequence parameters on a model without sequence batching), an unchanged tensor for a pipeline
    it asked for. ServerMetadata lists none of these extensions.
    """
    for key in _SEQUENCE_KEYS:
        if key in request.parameters:
            raise InputError(f"parameter {key!r}: model {view!r} has no sequence batching (the sequence extension "
                             "is not offered); send each request on its own", field=f"parameters.{key}")
    if "pipeline" in request.parameters and view != dicom_view:
        raise InputError(f"parameter 'pipeline' picks how DICOM is preprocessed; model {view!r} takes tensors that "
                         f"are already preprocessed (send DICOM to {dicom_view!r})", field="parameters.pipeline")
    for tensor in request.inputs:
        if any(key in tensor.parameters for key in _SHARED_MEMORY_KEYS):
            raise InputError(f"input {tensor.name!r} is sent in a shared-memory region: this server does not offer "
                             "the shared-memory extension; send it in raw_input_contents", field=tensor.name)
    for out in request.outputs:
        if any(key in out.parameters for key in _SHARED_MEMORY_KEYS):
            raise InputError(f"output {out.name!r} is requested in a shared-memory region: this server does not "
                             "offer the shared-memory extension; it answers in raw_output_contents", field="outputs")
        if "classification" in out.parameters:
            raise InputError(f"output {out.name!r} is requested as a classification: this server does not offer "
                             "the classification extension; request the tensor itself", field="outputs")


@dataclass
class ViewStats:
    """Cumulative per-view statistics in Triton's shape (durations in ns)."""

    inference_count: int = 0
    execution_count: int = 0
    success: tuple[int, int] = (0, 0)
    fail: tuple[int, int] = (0, 0)
    queue: tuple[int, int] = (0, 0)
    compute_input: tuple[int, int] = (0, 0)
    compute_infer: tuple[int, int] = (0, 0)
    last_inference_ms: int = 0

    @staticmethod
    def add(pair: tuple[int, int], seconds: float) -> tuple[int, int]:
        """One more (count, ns) entry of ``seconds``."""
        return pair[0] + 1, pair[1] + int(seconds * 1e9)

    def merge(self, done: ViewStats) -> None:
        """Add one successful request's counts and durations (Triton counts successful requests only)."""
        self.inference_count += done.inference_count
        for name in ("queue", "compute_input", "compute_infer"):
            mine, theirs = getattr(self, name), getattr(done, name)
            setattr(self, name, (mine[0] + theirs[0], mine[1] + theirs[1]))

    def message(self, name: str, version: str) -> oip.ModelStatistics:
        """These statistics as ModelStatistics' entry for the view ``name``."""
        return oip.ModelStatistics(
            name=name,
            version=version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=oip.InferStatistics(
                success=duration(self.success),
                fail=duration(self.fail),
                queue=duration(self.queue),
                compute_input=duration(self.compute_input),
                compute_infer=duration(self.compute_infer),
            ),
        )


def duration(pair: tuple[int, int]) -> oip.StatisticDuration:
    """A (count, ns) pair as Triton's StatisticDuration."""
    return oip.StatisticDuration(count=pair[0], ns=pair[1])


def model_metadata(view: str, model: ModelInfo, tensor: bool, outputs: Sequence[Output]) -> oip.ModelMetadataResponse:
    """ModelMetadata of one view: the tensor view (``tensor``) or the DICOM view; -1 marks a variable dimension."""
    meta = oip.ModelMetadataResponse.TensorMetadata
    answer = oip.ModelMetadataResponse(name=view, versions=[model.version], platform=PLATFORM)
    if tensor:
        answer.inputs.append(meta(name=model.input_name, datatype="FP32", shape=[-1, *model.item_shape]))
    else:
        answer.inputs.append(meta(name="dicom", datatype="BYTES", shape=[-1]))
    for name, datatype, shape in outputs:
        answer.outputs.append(meta(name=name, datatype=datatype, shape=[-1, *shape]))
    return answer


def model_config(view: str, model: ModelInfo, tensor: bool, outputs: Sequence[Output]) -> oip.ModelConfigResponse:
    """A Triton model configuration describing one view (what perf_analyzer needs)."""
    gpu = any(word in model.backend.lower() for word in ("cuda", "tensorrt", "gpu"))
    config = oip.ModelConfig(
        name=view,
        platform=PLATFORM,
        backend=PLATFORM,
        instance_group=[
            oip.ModelInstanceGroup(
                count=1, kind=oip.ModelInstanceGroup.KIND_GPU if gpu else oip.ModelInstanceGroup.KIND_CPU
            )
        ],
        # a preferred batch size only where there is a batch dimension: with max_batch_size 0 (the DICOM view)
        # Triton's own config check refuses one (held-out review, session 22)
        dynamic_batching=oip.ModelDynamicBatching(
            preferred_batch_size=[model.batch_size] if tensor else [], priority_levels=2, default_priority_level=2
        ),
    )
    for key, value in (
        ("engine_backend", model.backend),
        ("precision", model.precision),
        ("engine_batch_size", str(model.batch_size)),
        ("version", model.version),
    ):
        config.parameters[key].string_value = value
    types = {"FP32": oip.TYPE_FP32, "BYTES": oip.TYPE_STRING, "INT32": oip.TYPE_INT32, "BOOL": oip.TYPE_BOOL}
    if tensor:
        config.max_batch_size = model.batch_size
        config.input.append(oip.ModelInput(name=model.input_name, data_type=oip.TYPE_FP32, dims=model.item_shape))
        for name, datatype, shape in outputs:
            config.output.append(oip.ModelOutput(name=name, data_type=types[datatype], dims=shape))
    else:
        config.max_batch_size = 0  # the first dimension is files in, frames out: not a batch dimension
        config.input.append(oip.ModelInput(name="dicom", data_type=oip.TYPE_STRING, dims=[-1]))
        for name, datatype, shape in outputs:
            config.output.append(oip.ModelOutput(name=name, data_type=types[datatype], dims=[-1, *shape]))
    return oip.ModelConfigResponse(config=config)
