"""Fixed-batch forming, padding, priorities, deadlines and thermal pacing; the engine's one owner thread.

The inbox is a slot arena: ``queue_capacity`` preallocated model inputs (shared memory, see
:mod:`appliance.workers.arena`). Admission (:meth:`Batcher.reserve`) reserves one slot per frame or answers
RESOURCE_EXHAUSTED at once; a preprocessing worker process writes the frame straight into its slot and the pool
reports it (:meth:`frame_ready` / :meth:`frame_failed`); the engine thread gathers up to B ready slots into the
batch buffer, zero-pads the rest, runs the engine, and splits the outputs back. While the engine runs batch k,
the workers prepare the frames of batch k+1. Admitted frames that no worker has started yet expire at their
deadline too, freeing their slots.

The launch rule is the pure function :func:`appliance.batching.policy.choose`. Cancelled or expired items are dropped
before they are computed and their slots freed.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.batching.pacer import Pacer
from appliance.batching.policy import choose
from appliance.batching.work import ItemState, Request, WorkItem
from appliance.clock import Clock, RealClock
from appliance.config import BatcherConfig
from appliance.engines.base import Engine
from appliance.errors import (
    ApplianceError,
    ConfigError,
    DeadlineExceeded,
    EngineDeadError,
    EngineError,
    LimitExceeded,
    Overloaded,
    Unavailable,
)

if TYPE_CHECKING:
    from appliance.pipeline.steps import FrameInfo

__all__ = ["Batcher", "BatcherConfig", "BatchObserver", "Pacer", "QueueStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueStats:
    """A snapshot of the inbox (trio-style ``statistics()``)."""

    depth: int  # frames admitted and not yet launched
    capacity: int  # slots
    peak: int  # highest depth seen
    ready: int  # frames preprocessed and waiting for a batch
    rejected: int  # admissions refused because the inbox was full or the deadline unmeetable


class BatchObserver:
    """Receives batcher events; the metrics module subclasses it. Methods are called from batcher threads."""

    def on_batch(self, real: int, size: int, engine_s: float) -> None:
        """One batch ran with ``real`` items out of ``size`` slots."""

    def on_item(self, item: WorkItem) -> None:
        """One item finished (any final state)."""

    def on_rejected(self, reason: str) -> None:
        """One admission was refused (reason: QUEUE_FULL, DEADLINE_UNMEETABLE, ...)."""

    def on_worker_restart(self, reason: str) -> None:
        """A preprocessing worker process was replaced (reason: crashed, timeout, recycle, start)."""


class Batcher:
    """Owns the engine thread and the slot arena's bookkeeping. See the module docstring.

    Threads start in :meth:`start`, never in the constructor. ``stage_lock`` (sequential mode) is held around
    every engine run; the worker pool holds the same lock around every frame it decodes, so nothing overlaps.
    """

    def __init__(
        self,
        engine: Engine,
        config: BatcherConfig | None = None,
        *,
        clock: Clock | None = None,
        pacer: Pacer | None = None,
        observer: BatchObserver | None = None,
        on_engine_dead: Callable[[EngineDeadError], None] | None = None,
        arena: np.ndarray | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or BatcherConfig()
        self.clock = clock or RealClock()
        self.pacer = pacer or Pacer(self.clock)
        self.observer = observer or BatchObserver()
        self.on_engine_dead = on_engine_dead
        self.batch_size = engine.batch_size
        cap = self.config.queue_capacity
        if cap < self.batch_size:
            raise ConfigError(f"batcher.queue_capacity ({cap}) must be >= the model's batch size ({self.batch_size})")
        shape = (cap, *engine.item_shape)
        if arena is not None and (arena.shape != shape or arena.dtype != np.float32):
            raise ValueError(f"arena must be float32 {shape}, got {arena.dtype} {arena.shape}")
        self._arena = arena if arena is not None else np.zeros(shape, dtype=np.float32)
        self._batch = np.zeros((self.batch_size, *engine.item_shape), dtype=np.float32)
        self._free: collections.deque[int] = collections.deque(range(cap))
        self._ready: list[WorkItem] = []
        self._cond = threading.Condition()
        self._requests: set[Request] = set()  # admitted requests with unfinished frames
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self.stage_lock: threading.Lock | None = None if self.config.overlap else threading.Lock()
        # requests a worker is parsing (not admitted yet): frames the next batch may wait for (set by the app)
        self.parsing: Callable[[], int] = lambda: 0
        self.dead: EngineDeadError | None = None
        self.heartbeat = self.clock.monotonic()  # last time the engine thread made progress or idled
        self.batch_s_estimate = 0.05  # EMA of engine seconds per batch (seeded by warm-up)
        self.batches = 0
        self._peak = 0
        self._rejected = 0
        self._unfinished = 0  # admitted frames not yet finished (running ones included)
        self._running: list[WorkItem] = []  # the batch on the engine now (engine thread only)

    @property
    def slots(self) -> np.ndarray:
        """The slot arena, ``[queue_capacity, *item_shape]`` float32."""
        return self._arena

    # ---- admission (event loop / pool supervisor threads) -----------------------------------------------

    def statistics(self) -> QueueStats:
        """Return a snapshot of the inbox."""
        with self._cond:
            depth = self.config.queue_capacity - len(self._free)
            return QueueStats(depth, self.config.queue_capacity, self._peak, len(self._ready), self._rejected)

    def expected_wait_s(self, extra_items: int = 0) -> float:
        """Estimate seconds until ``extra_items`` more frames would be computed, at the current duty."""
        with self._cond:
            depth = self.config.queue_capacity - len(self._free)
        batches = math.ceil((depth + extra_items) / self.batch_size)
        duty = max(self.pacer.duty, 0.05)
        return batches * self.batch_s_estimate / duty

    def reserve(self, request: Request) -> None:
        """Admit a request: reserve one slot per frame. Its frames then wait for a worker (ADMITTED).

        Raises:
            Unavailable: draining, stopped, or the engine is dead.
            LimitExceeded: more frames than the inbox can ever hold.
            Overloaded: the inbox is full, or the request's deadline cannot be met at the current pace.
        """
        n = request.n_frames
        cap = self.config.queue_capacity
        if n > cap:
            raise LimitExceeded(
                f"instance has {n} frames, more than the inbox holds ({cap}; config key batcher.queue_capacity)",
                field="dicom.NumberOfFrames",
            )
        now = self.clock.monotonic()
        if request.deadline is not None:
            wait = self.expected_wait_s(n)
            if now + wait > request.deadline:
                self._reject("DEADLINE_UNMEETABLE")
                raise Overloaded(
                    f"queue cannot meet the deadline: expected wait {wait * 1000:.0f} ms exceeds the "
                    f"{max(0.0, request.deadline - now) * 1000:.0f} ms left",
                    retry_after_s=wait,
                    reason="DEADLINE_UNMEETABLE",
                )
        with self._cond:
            if self.dead is not None:
                raise Unavailable("engine is dead; the service is restarting", reason="ENGINE_DEAD")
            if not self._accepting:
                raise Unavailable("service is draining", reason="DRAINING")
            if len(self._free) < n:
                depth = cap - len(self._free)
                self._rejected += 1
                self.observer.on_rejected("QUEUE_FULL")
                raise Overloaded(
                    f"inbox full: {depth} of {cap} slots in use (config key batcher.queue_capacity)",
                    retry_after_s=self.batch_s_estimate * math.ceil(depth / self.batch_size),
                )
            for item in request.items:
                item.slot = self._free.popleft()
            self._unfinished += n
            self._requests.add(request)
            self._peak = max(self._peak, cap - len(self._free))

    def count_rejection(self, reason: str) -> None:
        """Count an admission refused before it reached the inbox (e.g. the worker queue was full)."""
        self._reject(reason)

    def _reject(self, reason: str) -> None:
        with self._cond:
            self._rejected += 1
        self.observer.on_rejected(reason)

    def begin_frame(self, item: WorkItem) -> bool:
        """A worker is about to write ``item``'s slot; False if it was cancelled or expired meanwhile."""
        with self._cond:
            if item.state != ItemState.ADMITTED or item.slot < 0:
                return False
            item.state = ItemState.PREPROCESSING
            return True

    def frame_ready(self, item: WorkItem, frame_info: FrameInfo | None, preprocess_ms: float) -> None:
        """``item``'s slot now holds its model input."""
        item.frame_info = frame_info
        item.preprocess_ms = preprocess_ms
        self._settle(item, None)

    def frame_failed(self, item: WorkItem, error: ApplianceError) -> None:
        """``item`` cannot be preprocessed (bad input, crashed or replaced worker)."""
        self._settle(item, error)

    def put_tensor(self, item: WorkItem, row: np.ndarray) -> None:
        """Write an already preprocessed model input into ``item``'s slot and mark it ready (tensor requests)."""
        if self.begin_frame(item):
            np.copyto(self._arena[item.slot], row, casting="same_kind")
            self._settle(item, None)

    def _settle(self, item: WorkItem, error: ApplianceError | None) -> None:
        finish = False
        with self._cond:
            if item.state.finished and item.state != ItemState.CANCELLED:
                return
            if item.state == ItemState.CANCELLED:
                self._release(item)  # cancel left the slot to the writer; already counted as finished
            elif item.state not in (ItemState.ADMITTED, ItemState.PREPROCESSING):
                return
            elif self.dead is not None:  # nobody will ever run it: answer now
                self._release(item)
                item.state = ItemState.FAILED
                item.error = Unavailable("engine is dead; the service is restarting", reason="ENGINE_DEAD")
                finish = True
            elif error is not None:
                self._release(item)
                item.state = ItemState.FAILED
                item.error = error
                finish = True
            else:
                item.state = ItemState.READY
                item.t_ready = self.clock.monotonic()
                self._ready.append(item)
                self._cond.notify_all()
        if finish:
            self._finish(item)

    def cancel(self, request: Request, error: ApplianceError) -> None:
        """Drop every unfinished frame of ``request`` that is not already in a running batch.

        Frees their slots (a frame being written by a worker frees its slot when the worker reports). A frame
        already inside a running batch cannot be aborted; its result is simply not awaited any more.
        """
        finished: list[WorkItem] = []
        with self._cond:
            for item in request.items:
                if item.state.finished or item.state == ItemState.RUNNING:
                    continue
                if item.state == ItemState.READY:
                    self._ready.remove(item)
                if item.state != ItemState.PREPROCESSING:
                    self._release(item)
                item.state = ItemState.CANCELLED
                item.error = error
                finished.append(item)
            self._cond.notify_all()
        for item in finished:
            self._finish(item)

    # ---- the engine thread ------------------------------------------------------------------------------

    def start(self, warmup_runs: int = 3) -> threading.Event:
        """Start the engine thread: it loads the engine, warms it up, sets the returned event, then loops.

        The engine is created, loaded and run on this one thread only (it holds the CUDA context, the
        TensorRT execution context or the ORT session). If loading fails, ``start_error`` holds the
        exception when the event is set.
        """
        self.ready = threading.Event()
        self.start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(warmup_runs,), name="engine", daemon=True)
        self._thread.start()
        return self.ready

    def _main(self, warmup_runs: int) -> None:
        try:
            self.engine.load()
            if warmup_runs > 0:
                self.warmup(warmup_runs)
        except BaseException as e:  # reported to the starter, which fails startup with it
            self.start_error = e
            self.ready.set()
            return
        self.heartbeat = self.clock.monotonic()
        self.ready.set()
        self._loop()

    def warmup(self, runs: int = 3) -> None:
        """Warm the engine up on the calling thread and seed the batch-time estimate."""
        self.engine.warmup(1)
        t0 = self.clock.monotonic()
        self.engine.warmup(runs)
        self.batch_s_estimate = max(1e-4, (self.clock.monotonic() - t0) / max(runs, 1))

    def _release(self, item: WorkItem) -> None:
        if item.slot >= 0:
            self._free.append(item.slot)
            item.slot = -1

    def _finish(self, item: WorkItem) -> None:
        """Count a frame as finished and, after its request's last frame, answer the request.

        Never raises: a failing observer or callback must not keep other requests from being answered.
        """
        with self._cond:
            self._unfinished -= 1
            if all(i.state.finished for i in item.request.items):
                self._requests.discard(item.request)
            self._cond.notify_all()
        try:
            self.observer.on_item(item)
        except Exception as e:  # noqa: BLE001 - metrics must never cost a reply
            log.error("batch observer failed on %r", item, exc_info=e)
        try:
            item.request.item_finished()
        except Exception as e:  # noqa: BLE001 - the request's own callback failed; nothing more to do for it
            log.error("completion callback failed for %r", item.request, exc_info=e)

    def _expire(self, now: float) -> list[WorkItem]:
        """Drop frames past their deadline that are ready, or admitted and not yet started by a worker."""
        expired = [i for i in self._ready if i.request.deadline is not None and now > i.request.deadline]
        for item in expired:
            self._ready.remove(item)
        for request in self._requests:
            if request.deadline is not None and now > request.deadline:
                expired.extend(i for i in request.items if i.state == ItemState.ADMITTED)
        for item in expired:
            self._release(item)
            item.state = ItemState.EXPIRED
            item.error = DeadlineExceeded("deadline passed before the frame was computed")
        return expired

    def _choose(self, now: float) -> tuple[list[WorkItem] | None, float]:
        """Return (items to launch now, or None) and how long to wait otherwise. Called under the lock."""
        b = self.batch_s_estimate
        decision = choose(
            self._ready,
            now,
            batch_size=self.batch_size,
            batch_s=b,
            pace_delay_s=self.pacer.delay(b) if self._ready else 0.0,
            pace_gap_s=self.pacer.gap(b),
            max_wait_s=self.config.max_wait_s,
            stopping=self._stopping,
            coming=self._coming(),
            coming_wait_s=math.inf if self.stage_lock is not None else min(b, 0.25),
        )
        if decision.launch is None:
            return None, decision.wait_s
        return [self._ready[i] for i in decision.launch], 0.0

    def _coming(self) -> int:
        """Frames on their way: admitted and not yet ready, plus requests still being parsed. Under the lock."""
        admitted = sum(1 for r in self._requests for i in r.items
                       if i.state in (ItemState.ADMITTED, ItemState.PREPROCESSING))
        return admitted + self.parsing()

    def _loop(self) -> None:
        try:
            self._loop_body()
        except Exception as e:  # a bug on the engine thread: nothing would ever run again, so say so loudly
            log.critical("engine thread failed", exc_info=e)
            error = EngineDeadError(f"engine thread failed: {type(e).__name__}: {e}")
            for item in self._running:
                if not item.state.finished:
                    item.state, item.error = ItemState.FAILED, error
                    self._finish(item)
            self._die(error)

    def _loop_body(self) -> None:
        """Expire -> choose -> launch -> collect, until stopped.

        Up to ``engine.max_in_flight`` batches are in flight (TensorRT: 2, so the copy of batch k+1 overlaps the compute
        of batch k; ONNX Runtime: 1).
        """
        in_flight: collections.deque[tuple[object, list[WorkItem], float]] = collections.deque()
        depth = max(1, int(getattr(self.engine, "max_in_flight", 1)))
        while True:
            items: list[WorkItem] | None = None
            with self._cond:
                now = self.clock.monotonic()
                self.heartbeat = now
                expired = self._expire(now)
                wait = 0.1
                if len(in_flight) < depth:
                    items, wait = self._choose(now)
                if items is None and not expired and not in_flight:
                    if self._stopping and self._unfinished == 0:
                        return
                    self._cond.wait(timeout=max(wait, 1e-4))
                    continue
                for item in items or ():
                    self._ready.remove(item)
                    item.state = ItemState.RUNNING
                    item.t_launch = now
            for item in expired:
                self._finish(item)
            if items:
                self._launch(items, in_flight)
            if in_flight and (not items or len(in_flight) >= depth):
                self._collect(*in_flight.popleft())
            if self.dead is not None:
                return

    def _launch(self, items: list[WorkItem], in_flight: collections.deque[tuple[object, list[WorkItem], float]]
                ) -> None:
        """Gather ``items`` into the batch buffer, pad, free their slots and submit the batch to the engine."""
        n = len(items)
        np.take(self._arena, [i.slot for i in items], axis=0, out=self._batch[:n])
        self._batch[n:] = 0.0  # explicit padding rows; their outputs are dropped in _collect
        with self._cond:
            for item in items:
                self._release(item)
            self._cond.notify_all()
        self._running = [*self._running, *items]
        t0 = self.clock.monotonic()
        lock = self.stage_lock if self.stage_lock is not None else contextlib.nullcontext()
        with lock:  # submit copies the batch out: the buffer is free again afterwards
            ok, ticket = self._engine_call(items, self.engine.submit, self._batch)
        if ok:
            in_flight.append((ticket, items, t0))

    def _engine_call(self, items: list[WorkItem], call: Callable[[Any], Any], arg: Any) -> tuple[bool, Any]:
        """Call the engine; on failure fail the batch's frames (EngineError, or a bug wrapped as one)."""
        try:
            return True, call(arg)
        except EngineError as e:
            self._fail_batch(items, e)
        except Exception as e:  # noqa: BLE001 - an engine bug: fail this batch, keep serving
            log.exception("engine raised unexpectedly")
            self._fail_batch(items, EngineError(f"engine failed: {type(e).__name__}: {e}"))
        return False, None

    def _collect(self, ticket: object, items: list[WorkItem], t0: float) -> None:
        """Wait for a submitted batch and split its rows back to its frames."""
        ok, outputs = self._engine_call(items, self.engine.result, ticket)
        if not ok:
            return
        engine_s = self.clock.monotonic() - t0
        self.heartbeat = self.clock.monotonic()
        self.pacer.consume(engine_s)
        self.batch_s_estimate = 0.8 * self.batch_s_estimate + 0.2 * engine_s
        self.batches += 1
        n = len(items)
        self.observer.on_batch(n, self.batch_size, engine_s)
        # NOTE: the only loop that splits a batch back into replies. Rows n..B-1 are padding: dropped here.
        for row, item in enumerate(items):
            item.outputs = {name: value[row].copy() for name, value in outputs.items()}
            item.engine_ms = engine_s * 1000.0
            item.state = ItemState.DONE
            self._finish(item)
        self._running = [i for i in self._running if i not in items]

    def _fail_batch(self, items: list[WorkItem], error: EngineError) -> None:
        self._running = [i for i in self._running if i not in items]
        if not isinstance(error, EngineDeadError):
            log.error("batch failed: %s", error)
        for item in items:
            item.state = ItemState.FAILED
            item.error = error
            self._finish(item)
        if isinstance(error, EngineDeadError):
            self._die(error)

    def _die(self, error: EngineDeadError) -> None:
        """The engine can run nothing more: refuse new work, answer every admitted frame, tell the app."""
        log.critical("engine dead: %s", error)
        with self._cond:
            self.dead = error
            self._accepting = False
            requests = list(self._requests)
        self.fail_pending(Unavailable("engine is dead; the service is restarting", reason="ENGINE_DEAD"), requests)
        if self.on_engine_dead is not None:
            self.on_engine_dead(error)

    def fail_pending(self, error: ApplianceError, requests: list[Request] | None = None) -> int:
        """Answer every admitted frame that is not in a running batch with ``error``; return how many.

        Used when nothing will run for a long time (engine dead, thermal stop, shutdown): an admitted request is
        answered, never left waiting. Frames a worker is writing are answered at once; the slot is freed when
        the worker reports.
        """
        with self._cond:
            targets = list(self._requests) if requests is None else requests
            before = self._unfinished
        for request in targets:
            self.cancel(request, error)
        with self._cond:
            return max(0, before - self._unfinished)

    @property
    def engine_thread_alive(self) -> bool:
        """True while the engine thread runs (loading, warming up or looping)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def unfinished(self) -> int:
        """Admitted frames not yet answered."""
        with self._cond:
            return self._unfinished

    def stop_accepting(self) -> None:
        """Refuse new requests (UNAVAILABLE) from now on; admitted work continues."""
        with self._cond:
            self._accepting = False

    def drain(self, timeout_s: float) -> bool:
        """Stop accepting and wait up to ``timeout_s`` (real time) for admitted work; True if all finished."""
        self.stop_accepting()
        deadline = self.clock.monotonic() + timeout_s
        with self._cond:
            while self._unfinished > 0 and self.dead is None:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=min(left, 0.05))
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the engine thread (after :meth:`drain`)."""
        with self._cond:
            self._stopping = True
            self._accepting = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
