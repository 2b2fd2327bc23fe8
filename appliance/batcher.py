"""Fixed-batch forming, padding, priorities, deadlines and thermal pacing; the engine's one owner thread.

The inbox is a slot arena: ``queue_capacity`` preallocated model inputs. Admission reserves one slot per frame
(or answers RESOURCE_EXHAUSTED at once); a preprocessing worker writes the frame straight into its slot; the
engine thread gathers up to B ready slots into the batch buffer, zero-pads the rest, runs the engine, and
splits the outputs back. While the engine runs batch k, the workers prepare the frames of batch k+1.

NOTE (launch rule): launch when B items are ready, or when the engine is idle and the oldest ready item has
waited ``max_wait``. INTERACTIVE items are taken before BATCH items, oldest first within a class. Cancelled or
expired items are dropped before they are computed and their slots freed. Under a thermal duty u < 1 the
pacer leaves gaps of about b(1-u)/u between batches; the batcher then also waits up to that gap for a full
batch, because a padded slot burns the same power as a real one — but never past an item's deadline.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from appliance.clock import Clock, RealClock
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
from appliance.work import ItemState, Priority, Request, WorkItem

__all__ = ["Batcher", "BatcherConfig", "BatchObserver", "Pacer", "QueueStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatcherConfig:
    """The batcher's knobs (``[batcher]`` in the config file)."""

    max_wait_s: float = 0.005  # how long the oldest ready item may wait for partners while the engine idles
    # Slots in the inbox. 64 frames = 8 batches of 8: at ~50 ms per CPU batch that is ~0.4 s of work, so a
    # full inbox still drains well inside an interactive client's deadline, while a series upload of a few
    # dozen slices is admitted whole. Each slot holds one model input (256 KiB at 1x256x256 float32).
    queue_capacity: int = 64
    overlap: bool = True  # preprocess in a worker pool while the engine runs; False = sequential (benchmarks)
    preprocess_workers: int = 1  # worker threads; cores left over by the engine's intra-op threads


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
        """A decoder worker process was restarted (reason: a short fixed word, e.g. crash, hang)."""


class Pacer:
    """Turns a thermal duty u in [0, 1] into gaps between launches: a token bucket of engine-busy seconds.

    The bucket refills at rate u and holds about one batch. A batch that takes b seconds may launch once the
    bucket holds b; for u < 1 that leaves gaps of about b(1-u)/u. Thread-safe. It also accounts the busy
    fraction the engine achieved, which the governor uses for anti-windup.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._duty = 1.0
        self._tokens = 0.0
        self._capacity = 0.0
        self._last = clock.monotonic()
        self._busy_s = 0.0
        self._busy_mark = self._last

    @property
    def duty(self) -> float:
        """The current duty."""
        return self._duty

    def set_duty(self, duty: float) -> None:
        """Set the duty (clamped to [0, 1])."""
        with self._lock:
            self._refill(self._clock.monotonic())
            self._duty = min(1.0, max(0.0, float(duty)))

    def _refill(self, now: float) -> None:
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._duty)
        self._last = now

    def delay(self, cost_s: float) -> float:
        """Return seconds to wait before a batch of ``cost_s`` may launch (0 = now, inf = paused)."""
        with self._lock:
            if self._duty >= 1.0:
                return 0.0
            if self._duty <= 0.0:
                return math.inf
            now = self._clock.monotonic()
            self._capacity = max(self._capacity, cost_s)
            self._refill(now)
            missing = cost_s - self._tokens
            return 0.0 if missing <= 1e-9 else missing / self._duty

    def gap(self, cost_s: float) -> float:
        """Return the steady-state gap b(1-u)/u between batches of ``cost_s`` at the current duty."""
        u = self._duty
        if u >= 1.0:
            return 0.0
        return math.inf if u <= 0.0 else cost_s * (1.0 - u) / u

    def consume(self, busy_s: float) -> None:
        """Account one batch that kept the engine busy for ``busy_s``."""
        with self._lock:
            now = self._clock.monotonic()
            self._capacity = max(self._capacity, busy_s)
            self._refill(now)
            self._tokens -= busy_s
            self._busy_s += busy_s

    def take_busy_fraction(self) -> float:
        """Return the fraction of time since the last call the engine was busy, and restart the window."""
        with self._lock:
            now = self._clock.monotonic()
            span = now - self._busy_mark
            frac = self._busy_s / span if span > 0 else 0.0
            self._busy_s = 0.0
            self._busy_mark = now
            return min(1.0, frac)


class Batcher:
    """Owns the engine thread, the slot arena and the preprocessing pool. See the module docstring."""

    def __init__(
        self,
        engine: Engine,
        config: BatcherConfig | None = None,
        *,
        clock: Clock | None = None,
        pacer: Pacer | None = None,
        observer: BatchObserver | None = None,
        on_engine_dead: Callable[[EngineDeadError], None] | None = None,
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
        self._arena = np.zeros((cap, *engine.item_shape), dtype=np.float32)
        self._batch = np.zeros((self.batch_size, *engine.item_shape), dtype=np.float32)
        self._free: collections.deque[int] = collections.deque(range(cap))
        self._ready: list[WorkItem] = []
        self._cond = threading.Condition()
        # frames waiting for a preprocessing worker, one queue per priority: INTERACTIVE is taken first
        self._pending: dict[Priority, collections.deque[WorkItem]] = {p: collections.deque() for p in Priority}
        self._requests: set[Request] = set()  # admitted requests with unfinished frames
        self._workers: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self.dead: EngineDeadError | None = None
        self.heartbeat = self.clock.monotonic()  # last time the engine thread made progress or idled
        self.batch_s_estimate = 0.05  # EMA of engine seconds per batch (seeded by warm-up)
        self.batches = 0
        self._peak = 0
        self._rejected = 0
        self._unfinished = 0  # admitted frames not yet finished (running ones included)
        self._running: list[WorkItem] = []  # the batch on the engine now (engine thread only)
        if self.config.overlap:
            for i in range(self.config.preprocess_workers):
                worker = threading.Thread(target=self._worker, name=f"preprocess-{i}", daemon=True)
                worker.start()
                self._workers.append(worker)

    # ---- admission (server threads / event loop) -------------------------------------------------------

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

    def submit(self, request: Request) -> None:
        """Admit a request: reserve one slot per frame and schedule preprocessing.

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
            if self.config.overlap:
                self._pending[request.priority].extend(request.items)
            else:
                for item in request.items:
                    item.t_ready = now
                    self._ready.append(item)
            self._cond.notify_all()

    def _reject(self, reason: str) -> None:
        with self._cond:
            self._rejected += 1
        self.observer.on_rejected(reason)

    def cancel(self, request: Request, error: ApplianceError) -> None:
        """Drop every unfinished frame of ``request`` that is not already in a running batch.

        Frees their slots (a frame being written by a worker frees its slot when the worker returns). A frame
        already inside a running batch cannot be aborted; its result is simply not awaited any more.
        """
        finished: list[WorkItem] = []
        with self._cond:
            for item in request.items:
                if item.state.finished or item.state == ItemState.RUNNING:
                    continue
                if item.state == ItemState.READY or (item.state == ItemState.ADMITTED and not self.config.overlap):
                    self._ready.remove(item)
                elif item.state == ItemState.ADMITTED:
                    self._pending[request.priority].remove(item)
                if item.state != ItemState.PREPROCESSING:
                    self._release(item)
                item.state = ItemState.CANCELLED
                item.error = error
                finished.append(item)
            self._cond.notify_all()
        for item in finished:
            self._finish(item)

    # ---- preprocessing (worker threads) -----------------------------------------------------------------

    def _preprocess_into_slot(self, item: WorkItem) -> ApplianceError | None:
        req = item.request
        t0 = self.clock.monotonic()
        try:
            item.frame_info = req.pipeline.run(req.instance, item.frame_index, self._arena[item.slot])
        except ApplianceError as e:
            return e
        except Exception as e:  # unexpected: a bug, not bad input; logged with traceback, reported INTERNAL
            log.exception("preprocessing failed unexpectedly for %r", item)
            return ApplianceError(f"preprocessing failed: {type(e).__name__}")
        finally:
            item.preprocess_ms = (self.clock.monotonic() - t0) * 1000.0
        return None

    def _worker(self) -> None:
        """A preprocessing worker: INTERACTIVE frames first, then BATCH, oldest first within a class."""
        while True:
            with self._cond:
                while not (self._stopping or any(self._pending.values())):
                    self._cond.wait()
                queue = next((q for q in self._pending.values() if q), None)
                if queue is None:  # stopping and nothing left
                    return
                item = queue.popleft()
                item.state = ItemState.PREPROCESSING
            self._preprocess(item)

    def _preprocess(self, item: WorkItem) -> None:
        error = self._preprocess_into_slot(item)
        finish = False
        with self._cond:
            if item.state == ItemState.CANCELLED:
                self._release(item)  # cancel left the slot to us; already counted as finished
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
        """Count a frame as finished and, after its request's last frame, answer the request. Never raises:
        a failing observer or callback must not keep other requests from being answered."""
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
        expired = [i for i in self._ready if i.request.deadline is not None and now > i.request.deadline]
        for item in expired:
            self._ready.remove(item)
            self._release(item)
            item.state = ItemState.EXPIRED
            item.error = DeadlineExceeded("deadline passed before the frame was computed")
        return expired

    def _choose(self, now: float) -> tuple[list[WorkItem] | None, float]:
        """Return (items to launch now, or None) and how long to wait otherwise. Called under the lock."""
        if not self._ready:
            return None, 0.1
        b = self.batch_s_estimate
        pace = self.pacer.delay(b)
        if pace > 0:
            return None, min(pace, 0.1)
        self._ready.sort(key=lambda i: (i.request.priority, i.t_ready))
        if len(self._ready) >= self.batch_size:
            return self._ready[: self.batch_size], 0.0
        oldest = min(i.t_ready or now for i in self._ready)
        max_wait = self.config.max_wait_s + min(self.pacer.gap(b), 1.0)  # under a budget, prefer full batches
        deadlines = [i.request.deadline for i in self._ready if i.request.deadline is not None]
        if deadlines:  # never hold an item past the point where its batch could still finish in time
            max_wait = min(max_wait, max(0.0, min(deadlines) - b - oldest))
        waited = now - oldest
        if waited >= max_wait or self._stopping:
            return list(self._ready), 0.0
        return None, max_wait - waited

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
        while True:
            with self._cond:
                now = self.clock.monotonic()
                self.heartbeat = now
                expired = self._expire(now)
                items, wait = self._choose(now)
                if items is None and not expired:
                    if self._stopping and self._unfinished == 0:
                        return
                    self._cond.wait(timeout=max(wait, 1e-4))
                    continue
                if items:
                    for item in items:
                        self._ready.remove(item)
                        item.state = ItemState.RUNNING
                        item.t_launch = now
            for item in expired:
                self._finish(item)
            if items:
                self._run_batch(items)
                if self.dead is not None:
                    return

    def _run_batch(self, items: list[WorkItem]) -> None:
        if not self.config.overlap:  # sequential mode: preprocess on the engine thread, nothing overlaps
            failed = [i for i in items if self._preprocess_failed(i)]
            items = [i for i in items if i not in failed]
            if not items:
                return
        self._running = items
        n = len(items)
        np.take(self._arena, [i.slot for i in items], axis=0, out=self._batch[:n])
        self._batch[n:] = 0.0  # explicit padding rows; their outputs are dropped below
        with self._cond:
            for item in items:
                self._release(item)
            self._cond.notify_all()
        t0 = self.clock.monotonic()
        try:
            outputs = self.engine.run(self._batch)
        except EngineError as e:
            self._fail_batch(items, e)
            return
        except Exception as e:  # noqa: BLE001 - an engine bug: fail this batch, keep serving
            log.exception("engine raised unexpectedly")
            self._fail_batch(items, EngineError(f"engine failed: {type(e).__name__}: {e}"))
            return
        engine_s = self.clock.monotonic() - t0
        self.heartbeat = self.clock.monotonic()
        self.pacer.consume(engine_s)
        self.batch_s_estimate = 0.8 * self.batch_s_estimate + 0.2 * engine_s
        self.batches += 1
        self.observer.on_batch(n, self.batch_size, engine_s)
        # NOTE: the only loop that splits a batch back into replies. Rows n..B-1 are padding: dropped here.
        for row, item in enumerate(items):
            item.outputs = {name: value[row].copy() for name, value in outputs.items()}
            item.engine_ms = engine_s * 1000.0
            item.state = ItemState.DONE
            self._finish(item)

    def _preprocess_failed(self, item: WorkItem) -> bool:
        error = self._preprocess_into_slot(item)
        if error is None:
            return False
        with self._cond:
            self._release(item)
        item.state = ItemState.FAILED
        item.error = error
        self._finish(item)
        return True

    def _fail_batch(self, items: list[WorkItem], error: EngineError) -> None:
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

        Used when nothing will run for a long time (engine dead, thermal stop): an admitted request is
        answered, never left waiting. Frames a worker is writing are answered when the worker returns.
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
        """Stop the engine thread (after :meth:`drain`) and the worker pool."""
        with self._cond:
            self._stopping = True
            self._accepting = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for worker in self._workers:
            worker.join(timeout_s)
