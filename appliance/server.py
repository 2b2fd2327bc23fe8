"""gRPC servicers: ``appliance.v1.Inference`` (Analyze, AnalyzeStream, GetStatus). Health and reflection are
registered by :mod:`appliance.app`.

Handlers only validate, admit and await a future; they never block the event loop (DICOM parsing runs in a
small executor). Every error leaves as the gRPC status of its :mod:`appliance.errors` class, with
``google.rpc`` details (ErrorInfo, BadRequest, RetryInfo); bad input never gets INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from appliance.errors import ApplianceError, InputError, Overloaded, Unavailable, UnknownPipeline
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.work import Priority, Request

if TYPE_CHECKING:
    from appliance.app import App

__all__ = ["InferenceServicer", "error_status"]

log = logging.getLogger(__name__)
DOMAIN = "edge-appliance"


def _pack(msg: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(msg)
    return packed


def error_status(error: ApplianceError) -> status_pb2.Status:
    """Return the google.rpc.Status for an appliance error (code, message, ErrorInfo, BadRequest, RetryInfo)."""
    details = [_pack(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN))]
    if isinstance(error, InputError):
        violation = error_details_pb2.BadRequest.FieldViolation(field=error.field, description=str(error))
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    retry = getattr(error, "retry_after_s", None)
    if retry is not None:
        seconds = max(0.0, float(retry))
        delay = duration_pb2.Duration(seconds=int(seconds), nanos=int((seconds % 1) * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    return status_pb2.Status(code=error.code.value[0], message=str(error), details=details)


class _FrameWindow:
    """Frames one stream may have admitted at once. A request larger than the window waits for it to empty."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._used = 0
        self._cond = asyncio.Condition()

    async def acquire(self, frames: int) -> int:
        """Wait until ``frames`` (capped at the window) fit; return how many were taken."""
        n = min(max(frames, 1), self.size)
        async with self._cond:
            await self._cond.wait_for(lambda: self._used + n <= self.size)
            self._used += n
        return n

    async def release(self, n: int) -> None:
        """Give back ``n`` frames."""
        async with self._cond:
            self._used -= n
            self._cond.notify_all()


class InferenceServicer(pb_grpc.InferenceServicer):
    """``appliance.v1.Inference`` over an :class:`~appliance.app.App`."""

    def __init__(self, app: App) -> None:
        self.app = app

    # ---- the one analyze path ---------------------------------------------------------------------------

    async def _analyze(
        self,
        req: pb.AnalyzeRequest,
        time_remaining: float | None,
        t0: float,
        admit: Callable[[int], Awaitable[None]] | None = None,
    ) -> pb.AnalyzeResponse:
        app = self.app
        app.check_admitting()
        name = req.pipeline or app.default_pipeline
        pipeline = app.pipelines.get(name)
        if pipeline is None:
            raise UnknownPipeline(f"unknown pipeline {name!r}; loaded: {sorted(app.pipelines)}", field="pipeline")
        if len(req.dicom) > app.config.server.max_message_bytes:
            raise Overloaded(
                f"request of {len(req.dicom)} bytes exceeds server.max_message_bytes = "
                f"{app.config.server.max_message_bytes}",
                retry_after_s=None,
                reason="MESSAGE_TOO_LARGE",
            )
        if time_remaining is None and app.config.server.default_deadline_s > 0:
            time_remaining = app.config.server.default_deadline_s
        deadline = None if time_remaining is None else t0 + time_remaining  # the client's, not after parsing
        loop = asyncio.get_running_loop()
        instance = await loop.run_in_executor(app.parse_executor, app.parse_dicom, req.dicom)
        pipeline.check(instance)
        if admit is not None:
            await admit(instance.number_of_frames)
        future: asyncio.Future[Request] = loop.create_future()

        def resolve(r: Request) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(r))

        request = Request(
            request_id=req.request_id or uuid.uuid4().hex,
            instance=instance,
            pipeline=pipeline,
            priority=Priority(req.priority) if req.priority in (0, 1) else Priority.BATCH,
            deadline=deadline,
            t_admit=app.clock.monotonic(),
            n_frames=instance.number_of_frames,
            on_done=resolve,
        )
        app.batcher.submit(request)
        try:
            await future
        except asyncio.CancelledError:
            app.batcher.cancel(request, Unavailable("client cancelled", reason="CANCELLED"))
            raise
        if request.error is not None:
            raise request.error
        return self._response(request, name, t0)

    def _response(self, request: Request, pipeline_name: str, t0: float) -> pb.AnalyzeResponse:
        app = self.app
        frames = []
        for item in request.items:
            f = app.postprocess(item.outputs or {}, item.frame_info)
            frame = pb.FrameResult(
                frame_index=item.frame_index,
                findings=[
                    pb.Finding(label=f.label, score=f.scores[f.label]),
                    *(pb.Finding(label=k, score=v) for k, v in f.scores.items() if k != f.label),
                ],
            )
            if f.location is not None:
                frame.location.CopyFrom(pb.Location(row=f.location[0], column=f.location[1], score=f.location[2]))
            frames.append(frame)
        items = request.items
        timings = pb.Timings(
            queue_ms=max(((i.t_launch or 0) - (i.t_ready or 0)) * 1000.0 for i in items),
            preprocess_ms=sum(i.preprocess_ms for i in items),
            engine_ms=max(i.engine_ms for i in items),
            total_ms=(app.clock.monotonic() - t0) * 1000.0,
        )
        return pb.AnalyzeResponse(
            request_id=request.request_id,
            sop_instance_uid=str(request.instance.sop_instance_uid),
            pipeline=pipeline_name,
            model=app.model_pb(),
            frames=frames,
            timings=timings,
            status=pb.ItemStatus(code=0, message="OK"),
        )

    def _finish(self, code: grpc.StatusCode, t0: float, response: pb.AnalyzeResponse | None = None) -> None:
        total = self.app.clock.monotonic() - t0
        self.app.metrics.count_request(code.name, total if code == grpc.StatusCode.OK else None)
        if response is not None:
            log.info(
                "Analyze %s sop=%s frames=%d total=%.1fms",
                response.request_id,
                response.sop_instance_uid,
                len(response.frames),
                response.timings.total_ms,
            )

    @staticmethod
    def _unexpected(e: Exception) -> ApplianceError:
        log.error("unexpected error in Analyze", exc_info=e)
        return ApplianceError(f"internal error: {type(e).__name__}")

    # ---- RPCs -------------------------------------------------------------------------------------------

    async def Analyze(self, request: pb.AnalyzeRequest, context: grpc.aio.ServicerContext) -> pb.AnalyzeResponse:  # noqa: N802
        """Analyze one DICOM instance."""
        t0 = self.app.clock.monotonic()
        try:
            response = await self._analyze(request, context.time_remaining(), t0)
        except asyncio.CancelledError:
            self._finish(grpc.StatusCode.CANCELLED, t0)
            raise
        except ApplianceError as e:
            self._finish(e.code, t0)
            await context.abort_with_status(rpc_status.to_status(error_status(e)))
            raise AssertionError("unreachable") from None
        except Exception as e:  # noqa: BLE001 - last rung of the ladder: wrap, log, INTERNAL
            err = self._unexpected(e)
            self._finish(err.code, t0)
            await context.abort_with_status(rpc_status.to_status(error_status(err)))
            raise AssertionError("unreachable") from None
        self._finish(grpc.StatusCode.OK, t0, response)
        return response

    async def AnalyzeStream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.AnalyzeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AnalyzeResponse]:
        """Analyze many instances; reply as each completes. Per-item failures go in the item's status.

        The stream applies backpressure instead of rejecting: at most half the inbox (at least one batch) of
        its *frames* are admitted at once, so a client streaming a whole series never sees QUEUE_FULL because
        of its own earlier items; gRPC flow control then slows the client down.
        """
        app = self.app
        window = _FrameWindow(max(app.batcher.batch_size, app.config.batcher.queue_capacity // 2))
        requests_in_flight = asyncio.Semaphore(2 * window.size)  # bounds memory held by parsed requests
        out: asyncio.Queue[pb.AnalyzeResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(req: pb.AnalyzeRequest) -> None:
            t0 = app.clock.monotonic()
            rid = req.request_id or uuid.uuid4().hex
            req.request_id = rid
            held = 0

            async def admit(n_frames: int) -> None:
                nonlocal held
                held = await window.acquire(n_frames)

            try:
                response = await self._analyze(req, context.time_remaining(), t0, admit)
                self._finish(grpc.StatusCode.OK, t0, response)
            except ApplianceError as e:
                self._finish(e.code, t0)
                item_status = pb.ItemStatus(code=e.code.value[0], message=str(e))
                response = pb.AnalyzeResponse(request_id=rid, status=item_status)
            except asyncio.CancelledError:
                self._finish(grpc.StatusCode.CANCELLED, t0)
                raise
            except Exception as e:  # noqa: BLE001
                err = self._unexpected(e)
                self._finish(err.code, t0)
                item_status = pb.ItemStatus(code=code_pb2.INTERNAL, message=str(err))
                response = pb.AnalyzeResponse(request_id=rid, status=item_status)
            finally:
                if held:
                    await window.release(held)
                requests_in_flight.release()
            await out.put(response)

        async def reader() -> None:
            try:
                async for req in request_iterator:
                    await requests_in_flight.acquire()
                    task = asyncio.create_task(one(req))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                await out.put(None)

        read_task = asyncio.create_task(reader())
        try:
            while (response := await out.get()) is not None:
                yield response
        finally:
            read_task.cancel()
            for task in list(tasks):
                task.cancel()

    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.Status:  # noqa: N802
        """Return the detailed status."""
        return self.app.status_pb()
