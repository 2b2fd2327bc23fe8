"""Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService`` over the Analyzer.

What tritonclient, perf_analyzer and KServe speak (docs/oip.md). One model is served as two views; both go
through the analyzer, so the same admission, batcher and thermal pacing apply:

- ``<model>`` (e.g. ``ct-nodule``): one FP32 input ``[N, *item_shape]``, already preprocessed, N <= B
  (``max_batch_size``) -> ``analyzer.infer``. Outputs: every engine output ``[N, *shape]`` FP32.
- ``<model>-dicom``: one BYTES input ``dicom`` ``[N]``, a DICOM Part-10 file per element -> ``analyzer.analyze``
  for each file, concurrently. Outputs, one row per frame (F = total frames, F = N for single-frame files):
  every engine output ``[F, *shape]`` FP32, ``label`` BYTES ``[F]``, ``score`` FP32 ``[F]`` (the label's
  probability), ``file_index`` and ``frame_index`` INT32 ``[F]``, ``lossy`` BOOL ``[F]`` (the pixels went through
  lossy compression: not diagnostic-grade input, as ``FrameResult.lossy`` says on ``appliance.v1``).

Tensors travel in ``raw_input_contents`` / ``raw_output_contents`` (typed ``contents`` are accepted on input).
Request parameters follow Triton's schedule-policy extension: ``priority`` (int64 or uint64; 1 = highest ->
INTERACTIVE, 0 = default -> BATCH) and ``timeout`` (microseconds; the tighter of it and the gRPC deadline is
passed on). An optional string parameter ``pipeline`` picks the DICOM pipeline. Errors leave as the gRPC status
of their appliance error class, with the same ``google.rpc`` details as ``appliance.v1``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.rpc import status_pb2
from grpc_status import rpc_status

from appliance import __version__
from appliance.batching.work import Priority
from appliance.errors import ApplianceError, InputError, LimitExceeded, Overloaded, UnknownModel
from appliance.privacy import MAX_REQUEST_ID, clip, validate_request_id
from appliance.proto.inference import grpc_service_pb2 as oip
from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc
from appliance.serving.admission import call_sender
from appliance.serving.oip_wire import (
    ViewStats,
    deserialize_bytes,
    model_config,
    model_metadata,
    only_typed_field,
    refuse_extensions,
    schedule,
    single_input,
    wanted_outputs,
)
from appliance.serving.oip_wire import response as make_response
from appliance.serving.server import FrameShare, FrameWindow, cancel_code, error_status, loggable_id

if TYPE_CHECKING:
    from appliance.serving.analysis import Analysis, Analyzer

__all__ = ["DICOM_SUFFIX", "SERVICE_NAME", "OipServicer", "add_to_server"]

log = logging.getLogger(__name__)

DICOM_SUFFIX = "-dicom"
SERVER_NAME = "edge-appliance"
#: Triton extensions served (perf_analyzer reads server-side statistics only when "statistics" is listed).
EXTENSIONS = ("model_configuration", "statistics", "schedule_policy")
SERVICE_NAME = oip.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name  # for reflection


_JOURNAL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _journal_name(name: str) -> str:
    """A model name as the journal may write it: names of letters, digits, '.', '_' and '-' only, else "-".

    The journal line is ``ModelInfer <view> <id> <code>``: a name with spaces could forge the rest of it.
    """
    return name if _JOURNAL_NAME.fullmatch(name) else "-"


class OipServicer(oip_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` (the subset in the module docstring) over an Analyzer."""

    def __init__(self, analyzer: Analyzer, *, max_files: int = 64, frame_window: int = 32,
                 max_message_bytes: int | None = None) -> None:
        self.analyzer = analyzer
        # DICOM bytes one ModelInfer may carry, all files together (server.max_message_bytes, as for one Analyze)
        self.max_message_bytes = max_message_bytes
        # DICOM files one ModelInfer may carry: every one needs a place in the queue for a preprocessing worker
        # (config key batcher.queue_capacity), so a request with more could never be served whole
        self.max_files = max_files
        # frames the files of one multi-file request may have admitted at once, as for one AnalyzeStream: a file
        # waits for its siblings' frames instead of being refused by them
        self.frame_window = frame_window
        self._stats = {self.tensor_view: ViewStats(), self.dicom_view: ViewStats()}
        self._next_id = 0

    @property
    def tensor_view(self) -> str:
        """The preprocessed-tensor model name, e.g. ``ct-nodule``."""
        return self.analyzer.model.name

    @property
    def dicom_view(self) -> str:
        """The DICOM model name, e.g. ``ct-nodule-dicom``."""
        return self.analyzer.model.name + DICOM_SUFFIX

    # ---- health and metadata ----------------------------------------------------------------------------

    async def ServerLive(self, request: oip.ServerLiveRequest, context: Any) -> oip.ServerLiveResponse:
        """Live while the process is not terminally dead."""
        return oip.ServerLiveResponse(live=self.analyzer.is_live())

    async def ServerReady(self, request: oip.ServerReadyRequest, context: Any) -> oip.ServerReadyResponse:
        """Ready while admitting work."""
        return oip.ServerReadyResponse(ready=self.analyzer.is_ready())

    async def ModelReady(self, request: oip.ModelReadyRequest, context: Any) -> oip.ModelReadyResponse:
        """Ready when the name (and version, if given) is served and the analyzer admits work."""
        known = request.name in self._stats and request.version in ("", self.analyzer.model.version)
        return oip.ModelReadyResponse(ready=known and self.analyzer.is_ready())

    async def ServerMetadata(self, request: oip.ServerMetadataRequest, context: Any) -> oip.ServerMetadataResponse:
        """Name, version and the Triton extensions served."""
        return oip.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: oip.ModelMetadataRequest, context: Any) -> oip.ModelMetadataResponse:
        """Inputs and outputs of one view (-1 marks a variable dimension)."""
        view = await self._view(request.name, request.version, context)
        return model_metadata(view, self.analyzer.model, view == self.tensor_view, self._outputs(view))

    async def ModelConfig(self, request: oip.ModelConfigRequest, context: Any) -> oip.ModelConfigResponse:
        """A Triton model configuration describing the view (what perf_analyzer needs)."""
        view = await self._view(request.name, request.version, context)
        return model_config(view, self.analyzer.model, view == self.tensor_view, self._outputs(view))

    async def ModelStatistics(self, request: oip.ModelStatisticsRequest, context: Any) -> oip.ModelStatisticsResponse:
        """Cumulative per-view counts and durations since start (empty name: every view)."""
        names = list(self._stats) if not request.name else [await self._view(request.name, request.version, context)]
        response = oip.ModelStatisticsResponse()
        response.model_stats.extend(self._stats[name].message(name, self.analyzer.model.version) for name in names)
        return response

    # ---- inference --------------------------------------------------------------------------------------

    async def ModelInfer(self, request: oip.ModelInferRequest, context: Any) -> oip.ModelInferResponse:
        """Run one request on the tensor or the DICOM view."""
        t0 = time.perf_counter()
        view = await self._view(request.model_name, request.model_version, context, journal=(request.id, t0))
        stats = self._stats[view]
        scratch = ViewStats()  # this request's counts: merged into the view's only if it succeeds
        self._next_id += 1
        request_id = request.id or f"oip-{self._next_id}"
        try:
            try:  # the client's id, once, before any work (the DICOM view's per-file ids are internal)
                validate_request_id(request.id)
            except InputError as e:
                raise InputError(f"id: {e}", field="id") from None
            priority, time_remaining = schedule(request, context)
            if len(request.outputs) > len(self._output_names(view)):  # some repeated: refused before any is read
                raise InputError(f"{len(request.outputs)} outputs requested; model {view!r} has "
                                 f"{len(self._output_names(view))}, each may be requested once", field="outputs")
            refuse_extensions(request, view, self.dicom_view)  # before computing anything
            wanted = wanted_outputs(request, view, self._output_names(view))
            infer = self._infer_tensor if view == self.tensor_view else self._infer_dicom
            names, tensors = await infer(request, request_id, priority, time_remaining, scratch, call_sender(context))
            response = make_response(request, view, self.analyzer.model.version, wanted, names, tensors)
        except asyncio.CancelledError:  # the client went away, or its deadline passed: journalled, then re-raised
            code = cancel_code(context).name
            self._journal(view, request_id, code, t0)
            if view == self.dicom_view:
                self.analyzer.count_finished(code, None)
            raise
        except Exception as e:  # every failure leaves as a status; AbortError is raised after this block
            stats.fail = ViewStats.add(stats.fail, time.perf_counter() - t0)
            status = self._status(e, view)
            if isinstance(e, ApplianceError):
                self.analyzer.count_refused(e)  # refused here, or by an uncounted file: counted once, here
            elif view == self.dicom_view:
                self.analyzer.count_finished("INTERNAL", None)
            self._journal(view, request_id, e.code.name if isinstance(e, ApplianceError) else "INTERNAL", t0)
        else:
            stats.merge(scratch)
            stats.success = ViewStats.add(stats.success, time.perf_counter() - t0)
            stats.execution_count += 1
            stats.last_inference_ms = int(time.time() * 1000)
            if view == self.dicom_view:  # its files ran uncounted: the request is counted once
                self.analyzer.count_finished("OK", time.perf_counter() - t0)
            self._journal(view, request_id, "OK", t0)
            return response
        await context.abort_with_status(rpc_status.to_status(status))
        raise AssertionError("unreachable: abort_with_status raises")

    async def _infer_tensor(
        self,
        request: oip.ModelInferRequest,
        request_id: str,
        priority: Priority,
        time_remaining: float | None,
        stats: ViewStats,
        source: str,
    ) -> tuple[list[str], list[np.ndarray]]:
        model = self.analyzer.model
        tensor, raw = single_input(request, model.input_name)
        if tensor.datatype != "FP32":
            raise InputError(f"input {tensor.name!r} must be FP32, got {tensor.datatype}", field=tensor.name)
        shape = tuple(tensor.shape)
        if len(shape) != len(model.item_shape) + 1 or shape[1:] != tuple(model.item_shape):
            raise InputError(
                f"input {tensor.name!r} must have shape [N, {', '.join(map(str, model.item_shape))}], "
                f"got {list(shape)}",
                field=tensor.name,
            )
        n = shape[0]
        if not 1 <= n <= model.batch_size:
            raise InputError(
                f"batch size {n} of input {tensor.name!r} is outside [1, {model.batch_size}] (max_batch_size)",
                field=tensor.name,
            )
        count = int(np.prod(shape))
        if raw is not None:
            if len(raw) != count * 4:
                raise InputError(
                    f"input {tensor.name!r}: {len(raw)} raw bytes, expected {count * 4} for FP32 {list(shape)}",
                    field=tensor.name,
                )
            array = np.frombuffer(raw, dtype="<f4").reshape(shape)
        else:
            only_typed_field(tensor, "fp32_contents")
            if len(tensor.contents.fp32_contents) != count:
                raise InputError(
                    f"input {tensor.name!r}: {len(tensor.contents.fp32_contents)} fp32_contents, expected {count}",
                    field=tensor.name,
                )
            array = np.asarray(tensor.contents.fp32_contents, dtype=np.float32).reshape(shape)
        t_in = time.perf_counter()
        rows = await self.analyzer.infer(
            np.ascontiguousarray(array, dtype=np.float32),
            request_id=request_id,
            priority=priority,
            time_remaining=time_remaining,
            source=source,
        )
        for row, outputs in enumerate(rows):  # finite inputs far outside the model's range can overflow it
            if not all(np.isfinite(value).all() for value in outputs.values()):
                error = InputError(f"row {row}: the model's outputs are not finite for this input (largest "
                                   f"magnitude {float(np.abs(array[row]).max()):g}); send inputs in the range the "
                                   "model's pipeline produces", field=tensor.name)
                error.counted = True  # the request path already counted this request (as OK: the engine ran)
                raise error
        stats.compute_infer = ViewStats.add(stats.compute_infer, time.perf_counter() - t_in)
        stats.inference_count += n
        names = self._output_names(self.tensor_view)
        return names, [np.stack([row[name] for row in rows]).astype(np.float32, copy=False) for name in names]

    async def _infer_dicom(
        self,
        request: oip.ModelInferRequest,
        request_id: str,
        priority: Priority,
        time_remaining: float | None,
        stats: ViewStats,
        source: str,
    ) -> tuple[list[str], list[np.ndarray]]:
        files = self._dicom_files(request)
        pipeline = ""
        if "pipeline" in request.parameters:
            if request.parameters["pipeline"].WhichOneof("parameter_choice") != "string_param":
                raise InputError("parameter 'pipeline' must be a string", field="parameters.pipeline")
            pipeline = request.parameters["pipeline"].string_param
        # Several files share one frame window, as the items of an AnalyzeStream do: two 33-frame files in a 64-slot
        # inbox were refused RESOURCE_EXHAUSTED by each other, at random, from an otherwise idle server (session 18)
        window = FrameWindow(self.frame_window) if len(files) > 1 else None

        async def one(i: int, data: bytes) -> Analysis:
            file_id = f"{request_id}/{i}"
            if len(file_id) > MAX_REQUEST_ID:  # a long client id: every file logs under it alone
                file_id = request_id
            share = FrameShare(window) if window is not None else None
            try:
                if share is not None:
                    await share.enter(time_remaining)
                return await self.analyzer.analyze(
                    data, request_id=file_id, pipeline=pipeline, priority=priority, time_remaining=time_remaining,
                    admit_frames=share.take if share is not None else None, wait_for_budget=share is not None,
                    source=source, counted=False, entered=True)  # one count per ModelInfer, in ModelInfer
            except ApplianceError as e:
                if len(files) > 1:  # say which element of the batch it was
                    e.args = (f"dicom[{i}]: {e}", *e.args[1:])
                raise
            finally:
                if share is not None:
                    await share.close()

        with self.analyzer.entered():  # through the door once: a drain begun since waits for every file
            tasks = [asyncio.ensure_future(one(i, data)) for i, data in enumerate(files)]
            try:
                analyses = await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()  # no-op for finished ones; the rest of a failed request is abandoned
        model = self.analyzer.model
        frames = [(i, f) for i, a in enumerate(analyses) for f in a.frames]
        stats.inference_count += len(frames)
        # once per request, as Triton counts them (clients divide the durations by the counts): the files run side
        # by side, so each phase lasted as long as its longest file's (per file, 3 files counted 3; review, s22)
        stats.queue = ViewStats.add(stats.queue, max(a.queue_ms for a in analyses) / 1e3)
        stats.compute_input = ViewStats.add(stats.compute_input, max(a.preprocess_ms for a in analyses) / 1e3)
        stats.compute_infer = ViewStats.add(stats.compute_infer, max(a.engine_ms for a in analyses) / 1e3)
        names = self._output_names(self.dicom_view)
        tensors = [
            np.stack([f.outputs[name] for _, f in frames]).astype(np.float32, copy=False).reshape(len(frames), *shape)
            for name, shape in model.outputs
        ]
        tensors.append(np.array([f.label.encode() for _, f in frames], dtype=object))
        tensors.append(np.array([f.scores.get(f.label, 0.0) for _, f in frames], dtype=np.float32))
        tensors.append(np.array([i for i, _ in frames], dtype=np.int32))
        tensors.append(np.array([f.frame_index for _, f in frames], dtype=np.int32))
        tensors.append(np.array([f.lossy for _, f in frames], dtype=np.bool_))
        return names, tensors

    def _dicom_files(self, request: oip.ModelInferRequest) -> list[bytes]:
        """The DICOM view's files, checked against the shape and the limits before more than that is read."""
        tensor, raw = single_input(request, "dicom")
        if tensor.datatype != "BYTES":
            raise InputError(f"input 'dicom' must be BYTES, got {tensor.datatype}", field="dicom")
        if len(tensor.shape) != 1 or tensor.shape[0] < 1:  # [1, 2] of 2 files read "more elements than 1"
            raise InputError(f"input 'dicom' must have shape [N]: one dimension, N >= 1 files, got "
                             f"{list(tensor.shape)}", field="dicom")
        declared = tensor.shape[0]
        if declared > self.max_files:  # before any element is looked at
            raise LimitExceeded(f"input 'dicom' holds {declared} files; at most {self.max_files} per request "
                                "(config key batcher.queue_capacity): send them in several requests", field="dicom")
        if raw is not None:
            files = deserialize_bytes(raw, "dicom", limit=declared)
        else:
            only_typed_field(tensor, "bytes_contents")
            if len(tensor.contents.bytes_contents) > declared:  # counted before a list is built
                raise InputError(f"dicom: more BYTES elements than the {declared} its shape declares", field="dicom")
            files = list(tensor.contents.bytes_contents)
        if declared != len(files):
            raise InputError(f"input 'dicom' has shape {list(tensor.shape)} but {len(files)} elements",
                             field="dicom")
        total = sum(len(f) for f in files)
        if self.max_message_bytes is not None and total > self.max_message_bytes:
            # per request, as for Analyze: two 32.3 MiB files used to pass where one of 64.2 MiB did not (session 18)
            raise Overloaded(f"request of {total} bytes of DICOM in {len(files)} files exceeds "
                             f"server.max_message_bytes = {self.max_message_bytes}", retry_after_s=None,
                             reason="MESSAGE_TOO_LARGE")
        return files

    # ---- helpers ----------------------------------------------------------------------------------------

    def _outputs(self, view: str) -> list[tuple[str, str, tuple[int, ...]]]:
        outputs = [(name, "FP32", tuple(shape)) for name, shape in self.analyzer.model.outputs]
        if view == self.dicom_view:
            outputs += [("label", "BYTES", ()), ("score", "FP32", ()), ("file_index", "INT32", ())]
            outputs += [("frame_index", "INT32", ()), ("lossy", "BOOL", ())]
        return outputs

    async def _view(self, name: str, version: str, context: Any, *,
                    journal: tuple[str, float] | None = None) -> str:
        """``name`` if it is a served view, else abort NOT_FOUND.

        ModelInfer's refusal (``journal``: the client's id and the call's start) gets its journal line first, so
        the line is there before the client can see the answer.
        """
        if name not in self._stats:
            why = f"Request for unknown model: '{clip(name)}' is not found (served: {', '.join(self._stats)})"
        elif version not in ("", self.analyzer.model.version):
            why = (f"Request for unknown model: '{name}' version {clip(version)} is not found "
                   f"(served: {self.analyzer.model.version})")
        else:
            return name
        error = UnknownModel(why, field="model_name")
        if journal is not None:  # a ModelInfer: journalled and counted like every other refusal
            self._journal(_journal_name(name), journal[0], "NOT_FOUND", journal[1])
            self.analyzer.count_refused(error)
        await context.abort_with_status(rpc_status.to_status(error_status(error)))
        raise AssertionError("unreachable: abort_with_status raises")

    def _output_names(self, view: str) -> list[str]:
        names = [name for name, _ in self.analyzer.model.outputs]
        return names if view == self.tensor_view else [*names, "label", "score", "file_index", "frame_index", "lossy"]

    @staticmethod
    def _journal(view: str, request_id: str, code: str, t0: float) -> None:
        """One log line per ModelInfer, as appliance.v1 writes per Analyze (REQUEST_ID, CODE, MS journal fields)."""
        ms = (time.perf_counter() - t0) * 1000.0
        rid = loggable_id(request_id)
        log.info("ModelInfer %s %s %s total=%.1fms", view, rid, code, ms,
                 extra={"request_id": rid, "code": code, "ms": f"{ms:.1f}"})

    @staticmethod
    def _status(error: Exception, view: str) -> status_pb2.Status:
        if isinstance(error, ApplianceError):
            return error_status(error)
        log.error("ModelInfer on %s failed unexpectedly", view, exc_info=error)
        return status_pb2.Status(
            code=grpc.StatusCode.INTERNAL.value[0], message=f"internal error: {type(error).__name__}"
        )


_SERVICE = "inference.GRPCInferenceService"


class _NotOffered(grpc.GenericRpcHandler):
    """The service's RPCs this server does not offer: UNIMPLEMENTED, naming what it does offer.

    Triton's ModelStreamInfer, repository, shared-memory, trace and log-settings calls got gRPC's own "Method not
    found!" (held-out review, session 22: tritonclient's ``start_stream`` met that).
    """

    def __init__(self) -> None:
        self.offered = sorted(oip.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        prefix = f"/{_SERVICE}/"
        method = handler_call_details.method or ""
        if not method.startswith(prefix):
            return None
        name = clip(method[len(prefix):])
        message = (f"{name} is not offered by this server; its {_SERVICE} implements {', '.join(self.offered)} "
                   "(docs/oip.md)")

        async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        return grpc.stream_stream_rpc_method_handler(refuse)


def add_to_server(server: grpc.aio.Server, analyzer: Analyzer, *, max_files: int = 64,
                  frame_window: int = 32, max_message_bytes: int | None = None) -> OipServicer:
    """Register ``inference.GRPCInferenceService`` over ``analyzer`` on a grpc.aio server; return the servicer."""
    servicer = OipServicer(analyzer, max_files=max_files, frame_window=frame_window,
                           max_message_bytes=max_message_bytes)
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((_NotOffered(),))  # consulted after the service's own methods
    return servicer
