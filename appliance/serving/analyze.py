"""The one request path, readable top to bottom in :meth:`RequestPath.analyze`.

    check admitting -> check pipeline and size -> take the in-flight byte budget -> a worker process parses,
    validates and checks the pipeline (the daemon never holds the dataset) -> admit: reserve one slot per frame
    -> the worker decodes each frame straight into its slot -> the batcher runs fixed batches on the engine
    thread -> postprocess -> :class:`Analysis`

Every gRPC servicer (``appliance.v1``, the Open Inference Protocol) only translates protobuf to and from this
module, through the small :class:`~appliance.serving.analysis.Analyzer` protocol. Every admitted request is
answered: with its result, or with an :class:`~appliance.errors.ApplianceError` (deadline, queue full, draining, a
decoder that crashed), never left waiting. On shutdown :meth:`RequestPath.fail_all` answers whatever is left
UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from appliance.batching.batcher import Batcher
from appliance.batching.inbox import Keep
from appliance.batching.work import Priority, Request, WorkItem
from appliance.clock import Clock
from appliance.errors import (
    ApplianceError,
    DeadlineExceeded,
    InputError,
    Overloaded,
    Unavailable,
    UnknownPipeline,
)
from appliance.pipeline.postprocess import Postprocessor
from appliance.privacy import clip
from appliance.serving.admission import BATCH_SHARE, ByteBudget, Senders, WorkerGate
from appliance.serving.analysis import AdmitFrames, Analysis, FrameAnalysis, ModelInfo
from appliance.workers.pool import Job, WorkerPool

__all__ = ["DEADLINE_SLACK_S", "PathLimits", "RequestPath"]


#: A cancel this close to the client's deadline (or past it) is the deadline's, not the client's (clocks and timers
#: of gRPC and this path differ by milliseconds).
DEADLINE_SLACK_S = 0.005


@dataclass(frozen=True)
class PathLimits:
    """The request path's bounds (from ``[server]``)."""

    max_message_bytes: int  # one request's DICOM bytes
    inflight_bytes: int  # DICOM bytes held by requests not yet answered, all together
    default_deadline_s: float  # applied when the client sends none (> 0: a wedged stage never holds a request)
    # Requests waiting for a worker (queued or parsing, not yet admitted to slots). Bounded like the inbox: a
    # full queue is RESOURCE_EXHAUSTED at once (streams wait instead), so nothing queues for seconds unseen.
    max_unadmitted: int = 64


class RequestPath:
    """The :class:`Analyzer` of a running daemon: composes the worker pool, the batcher and postprocessing."""

    def __init__(
        self,
        *,
        model: ModelInfo,
        pipelines: frozenset[str],
        default_pipeline: str,
        pool: WorkerPool,
        batcher: Batcher,
        postprocess: Postprocessor,
        clock: Clock,
        limits: PathLimits,
        check_admitting: Callable[[], None],
        validate_request_id: Callable[[str], str] = lambda rid: rid,
        on_finished: Callable[[str, float | None], None] = lambda code, seconds: None,
    ) -> None:
        self._model = model
        self.pipelines = pipelines
        self.default_pipeline = default_pipeline
        self.pool = pool
        self.batcher = batcher
        self.postprocess = postprocess
        self.clock = clock
        self.limits = limits
        self._check_admitting = check_admitting
        self._validate_request_id = validate_request_id
        self._on_finished = on_finished  # (final gRPC code name, total seconds if OK): metrics, any protocol
        self._budget = ByteBudget(limits.inflight_bytes)
        self._senders = Senders(clock)  # requests in flight per sender: who gets the whole of a shared bound
        self._gate = WorkerGate(pool, batcher, clock, limits.max_unadmitted, lambda: self._check_admitting())
        self._waiting: set[asyncio.Future[Request]] = set()  # every unanswered request, for fail_all
        # calls inside analyze/infer, including those still waiting for queue room, the byte budget or a frame
        # window (not yet in _waiting): a drain waits for them too, or the server's stop cancels them
        self._active = 0
        self._admission = threading.Lock()  # one admission or one cancel at a time (_admit, _drop)
        self.live = True

    @property
    def model(self) -> ModelInfo:
        """The served model."""
        return self._model

    @model.setter
    def model(self, info: ModelInfo) -> None:
        self._model = info  # once the engine is loaded, ``backend`` says what actually runs

    def is_live(self) -> bool:
        """False once the engine died or the GPU was lost."""
        return self.live and self.batcher.dead is None

    def is_ready(self) -> bool:
        """True while new work is admitted."""
        try:
            self._check_admitting()
        except Unavailable:
            return False
        return True

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """A call of several files (an OIP request, a stream's item waiting for its window) through the door.

        Checked once here (UNAVAILABLE while draining). The drain waits for the whole call, and its files
        (``analyze(..., entered=True)``) are not refused by a drain that began after it entered: the later files of
        an 8-file request accepted before a SIGTERM were refused DRAINING while waiting for the frame window, and the
        whole request with them (held-out review, session 22).
        """
        self._check_admitting()
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1

    @property
    def in_flight(self) -> int:
        """Requests not yet answered."""
        return len(self._waiting)

    # ---- the path -------------------------------------------------------------------------------------------

    async def analyze(
        self,
        dicom: bytes,
        *,
        request_id: str = "",
        pipeline: str = "",
        priority: Priority = Priority.BATCH,
        time_remaining: float | None = None,
        admit_frames: AdmitFrames | None = None,
        wait_for_budget: bool = False,
        source: str = "",
        counted: bool = True,
        entered: bool = False,
    ) -> Analysis:
        """Analyze one DICOM Part 10 file. ``admit_frames`` (streams) may wait before slots are reserved.

        ``source`` names the sender (``admission.sender_of``): queued files from different senders take turns for the
        preprocessing workers (appliance.workers.jobqueue), so one sender's flood cannot hold back another's file.
        """
        t0 = self.clock.monotonic()
        self._active += 1
        try:
            with self._counted(t0, time_remaining) if counted else contextlib.nullcontext():  # else the caller
                return await self._analyze(dicom, t0, request_id, pipeline, priority, time_remaining, admit_frames,
                                           wait_for_budget, source, entered)
        finally:
            self._active -= 1

    async def _analyze(
        self,
        dicom: bytes,
        t0: float,
        request_id: str,
        pipeline: str,
        priority: Priority,
        time_remaining: float | None,
        admit_frames: AdmitFrames | None,
        wait_for_budget: bool,
        source: str,
        entered: bool,
    ) -> Analysis:
        if not entered:
            self._check_admitting()
        else:  # a file of a call already through the door (entered()) is not new work, until the grace is spent
            self._check_still_admitting()
            self.batcher.require_accepting()  # refused now, not parsed and then refused, or CANCELLED at the stop
        rid = self._validate_request_id(request_id) or uuid.uuid4().hex
        name = pipeline or self.default_pipeline
        if name not in self.pipelines:
            raise UnknownPipeline(f"unknown pipeline {clip(name)!r}; loaded: {sorted(self.pipelines)}",
                                  field="pipeline")
        if len(dicom) > self.limits.max_message_bytes:
            raise Overloaded(
                f"request of {len(dicom)} bytes exceeds server.max_message_bytes = {self.limits.max_message_bytes}",
                retry_after_s=None,
                reason="MESSAGE_TOO_LARGE",
            )
        deadline = t0 + (time_remaining if time_remaining is not None else self.limits.default_deadline_s)
        share = self._senders.share(source)  # 1.0, or SENDER_SHARE for a sender already in flight
        with self._senders.count(source):
            async with self._budget.hold(len(dicom), wait=wait_for_budget, share=share):
                loop = asyncio.get_running_loop()
                done = _new_future(loop)
                request = Request(rid, name, priority, deadline, t0, on_done=lambda r: _resolve(loop, done, r))

                def admit(n_frames: int, sop_uid: str) -> list[WorkItem]:  # on a pool supervisor thread
                    if admit_frames is None:  # nothing to wait for: reserve right here, no hop to the event loop
                        return self._admit(job, n_frames, sop_uid, *self._keep_free(source, priority))
                    return self._admit_stream(loop, job, n_frames, sop_uid, admit_frames)

                job = Job(request, dicom, name, admit, fail=lambda e: _reject(loop, done, e), source=source)
                await self._gate.room(deadline, wait=wait_for_budget, share=share, priority=priority,
                                      source=source, admitting=not entered)
                self.pool.submit(job)
                await self._wait(done, request, job)
        return self._analysis(request, t0)

    async def infer(
        self,
        inputs: np.ndarray,
        *,
        request_id: str = "",
        priority: Priority = Priority.BATCH,
        time_remaining: float | None = None,
        source: str = "",
    ) -> list[dict[str, np.ndarray]]:
        """Run already preprocessed ``[N, *item_shape]`` float32 inputs through admission, batcher and engine.

        ``source`` names the sender, as for :meth:`analyze`: one already in flight gets a share of the inbox.
        """
        t0 = self.clock.monotonic()
        self._active += 1
        try:
            with self._counted(t0, time_remaining), self._senders.count(source):
                return await self._infer(inputs, t0, request_id, priority, time_remaining, source)
        finally:
            self._active -= 1

    async def _infer(
        self, inputs: np.ndarray, t0: float, request_id: str, priority: Priority, time_remaining: float | None,
        source: str,
    ) -> list[dict[str, np.ndarray]]:
        self._check_admitting()
        rid = self._validate_request_id(request_id) or uuid.uuid4().hex
        shape = self._model.item_shape
        if inputs.dtype != np.float32 or inputs.ndim != len(shape) + 1 or tuple(inputs.shape[1:]) != shape:
            raise InputError(f"input must be float32 [N, {', '.join(map(str, shape))}], got {inputs.dtype} "
                             f"{list(inputs.shape)}", field=self._model.input_name)
        if not np.isfinite(inputs).all():
            bad = np.flatnonzero(~np.isfinite(inputs.reshape(len(inputs), -1)).all(axis=1))
            raise InputError(f"input {self._model.input_name!r} row {int(bad[0])} contains NaN or infinity "
                             f"({len(bad)} of {len(inputs)} rows do)", field=self._model.input_name)
        deadline = t0 + (time_remaining if time_remaining is not None else self.limits.default_deadline_s)
        loop = asyncio.get_running_loop()
        done = _new_future(loop)
        request = Request(rid, "", priority, deadline, t0, n_frames=len(inputs),
                          on_done=lambda r: _resolve(loop, done, r))
        self.batcher.reserve(request, **self._keep_free(source, priority)._asdict())
        for item, row in zip(request.items, inputs, strict=True):
            self.batcher.put_tensor(item, row)
        await self._wait(done, request, None)
        return [dict(item.outputs or {}) for item in request.items]

    def _check_still_admitting(self) -> None:
        """The admission check for a call already inside the path: a drain lets it finish (it checked at the door)."""
        try:
            self._check_admitting()
        except Unavailable as e:
            if e.reason != "DRAINING":
                raise

    def _keep_free(self, source: str, priority: Priority) -> Keep:
        """The inbox slots a request must leave free, for whom, and the reason a refusal for them gives.

        A sender counted in flight leaves the other senders' reserve; a BATCH request leaves INTERACTIVE's
        (``BATCH_SHARE``, as at the workers), whichever is larger. Kept only at the workers, a BATCH backlog of
        multi-frame files still filled the inbox, and INTERACTIVE requests were parsed only to be refused.
        """
        cap = self.batcher.config.queue_capacity
        senders = cap - int(cap * self._senders.share(source, counted=True))
        interactive = cap - int(cap * BATCH_SHARE) if priority is Priority.BATCH else 0
        if interactive > senders:
            return Keep(interactive, "INTERACTIVE requests", "QUEUE_FULL")
        return Keep(senders, "other senders", "SENDER_SHARE")

    @contextlib.contextmanager
    def _counted(self, t0: float, time_remaining: float | None = None) -> Iterator[None]:
        """Report every request's final status (and its latency when OK), whatever the protocol.

        A cancel at or past the client's deadline is gRPC ending the call for its deadline, racing this path's own
        timer: counted DEADLINE_EXCEEDED, as the client sees it (held-out review, session 18: 76 of 194 expiries were
        counted CANCELLED).
        """
        code = "OK"
        try:
            yield
        except asyncio.CancelledError:
            expired = time_remaining is not None and self.clock.monotonic() - t0 >= time_remaining - DEADLINE_SLACK_S
            code = "DEADLINE_EXCEEDED" if expired else "CANCELLED"
            raise
        except ApplianceError as e:
            code = e.code.name
            e.counted = True  # a protocol that refuses requests before this path counts its own (count_refused)
            raise
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            self._on_finished(code, self.clock.monotonic() - t0 if code == "OK" else None)

    def count_refused(self, error: ApplianceError) -> None:
        """Count a request a protocol layer refused before it reached this path, unless this path counted it."""
        if not error.counted:
            self._on_finished(error.code.name, None)

    def count_finished(self, code: str, seconds: float | None) -> None:
        """Count a request whose files were analyzed uncounted (``analyze(counted=False)``): one OIP ModelInfer."""
        self._on_finished(code, seconds)

    def _admit(self, job: Job, n_frames: int, sop_uid: str, keep_free: int, kept_for: str = "other senders",
               kept_reason: str = "SENDER_SHARE") -> list[WorkItem]:
        """Reserve one slot per frame of a parsed file (any thread); raise if that is refused or it was cancelled.

        Atomic against :meth:`_drop` (one lock): a cancel either comes first, and nothing is reserved, or finds
        every frame reserved and frees them. A refused reservation leaves the request with no frames at all.
        """
        request = job.request
        with self._admission:
            if job.cancelled:
                raise Unavailable("client cancelled", reason="CANCELLED")
            request.set_frames(n_frames, sop_uid)
            try:
                self._check_still_admitting()
                self.batcher.reserve(request, keep_free=keep_free, kept_for=kept_for, kept_reason=kept_reason)
            except BaseException:
                request.set_frames(0)  # never admitted: a late cancel has nothing to free
                raise
        return request.items

    def _admit_stream(
        self,
        loop: asyncio.AbstractEventLoop,
        job: Job,
        n_frames: int,
        sop_uid: str,
        admit_frames: AdmitFrames,
    ) -> list[WorkItem]:
        """A stream's file: wait on the event loop for the stream's frame window, then admit; bounded wait."""

        async def admit() -> list[WorkItem]:
            admitted = await admit_frames(n_frames)
            try:
                # a stream waits for room in the inbox too, as it waits for its window: ten 64-frame files on one
                # stream beside light unary clients had 3 items refused "inbox full: 1 of 64 slots in use" (session 18)
                cap = self.batcher.config.queue_capacity
                while (n_frames <= cap and cap - self.batcher.statistics().depth < n_frames  # larger: refused now
                       and self.clock.monotonic() < (job.request.deadline or math.inf)):
                    # a file of a call inside the door (entered()): a drain lets it wait; the inbox refuses it once
                    # the grace is spent (several 8-file requests at once were refused DRAINING here; review, s22)
                    self._check_still_admitting()
                    await asyncio.sleep(0.01)
                # a stream is bounded by its own window instead (AnalyzeStream), so it never meets its own share here
                return self._admit(job, n_frames, sop_uid, keep_free=0)
            finally:
                if admitted is not None:
                    admitted()  # only now may the next file of its window go to a worker

        future = asyncio.run_coroutine_threadsafe(admit(), loop)
        deadline = job.request.deadline
        left = (deadline or self.clock.monotonic() + 30.0) - self.clock.monotonic()
        try:
            return future.result(timeout=max(0.01, left))
        except TimeoutError:
            future.cancel()
            raise DeadlineExceeded("deadline passed while waiting for admission") from None
        except (asyncio.CancelledError, concurrent.futures.CancelledError):  # the latter from future.result()
            raise Unavailable("admission cancelled (client gone, or the daemon is stopping)",
                              reason="CANCELLED") from None

    async def _wait(self, done: asyncio.Future[Request], request: Request, job: Job | None) -> None:
        """Await the answer; on deadline or client cancel, drop the work and free its slots."""
        self._waiting.add(done)
        try:
            left = (request.deadline or 0.0) - self.clock.monotonic()
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout=max(0.0, left))
            except TimeoutError:
                if not done.done():
                    error = DeadlineExceeded("deadline passed before the request was answered")
                    self._drop(request, job, error)
                    raise error from None
            except asyncio.CancelledError:
                self._drop(request, job, Unavailable("client cancelled", reason="CANCELLED"))
                raise
        finally:
            self._waiting.discard(done)
        failure = done.exception() or request.error
        if failure is not None:
            raise failure

    def _drop(self, request: Request, job: Job | None, error: ApplianceError) -> None:
        with self._admission:  # not halfway through an admission on a supervisor thread (see _admit)
            if job is not None:
                self.pool.cancel(job)
            admitted = bool(request.items)
        if admitted:
            self.batcher.cancel(request, error)

    def _analysis(self, request: Request, t0: float) -> Analysis:
        frames = []
        for item in request.items:
            found = self.postprocess(item.outputs or {}, item.frame_info)
            frames.append(FrameAnalysis(item.frame_index, dict(item.outputs or {}), found.label, found.scores,
                                        found.location, item.frame_info is not None and item.frame_info.lossy))
        items = request.items
        return Analysis(
            request_id=request.request_id,
            sop_instance_uid=request.sop_instance_uid,
            pipeline=request.pipeline,
            frames=tuple(frames),
            queue_ms=max(((i.t_launch or 0) - (i.t_ready or 0)) * 1000.0 for i in items),
            preprocess_ms=sum(i.preprocess_ms for i in items),
            engine_ms=max(i.engine_ms for i in items),
            total_ms=(self.clock.monotonic() - t0) * 1000.0,
        )

    # ---- shutdown -------------------------------------------------------------------------------------------

    def fail_all(self, error: ApplianceError) -> int:
        """Answer every unanswered request with ``error`` (shutdown past grace, thermal stop); return how many."""
        self.pool.fail_queued(error)
        self.batcher.fail_pending(error)
        waiting = [f for f in self._waiting if not f.done()]
        for future in waiting:
            future.set_exception(error)
        return len(waiting)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every request to be answered and every call to leave; True if none is left."""
        deadline = self.clock.monotonic() + timeout_s
        while (self._waiting or self._active) and self.clock.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self._waiting and not self._active


def _new_future(loop: asyncio.AbstractEventLoop) -> asyncio.Future[Request]:
    """A future whose late exception (the client already left) is never reported as "never retrieved"."""
    future: asyncio.Future[Request] = loop.create_future()
    future.add_done_callback(lambda f: None if f.cancelled() else f.exception())
    return future


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Request], request: Request) -> None:
    def settle() -> None:
        if not future.done():
            future.set_result(request)

    loop.call_soon_threadsafe(settle)


def _reject(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Request], error: ApplianceError) -> None:
    def settle() -> None:
        if not future.done():
            future.set_exception(error)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(settle)
