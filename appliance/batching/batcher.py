"""The engine loop: fixed batches from the inbox's ready frames, run on the engine's one owner thread.

One turn of the loop is :meth:`Batcher.step`: **expire** frames past their deadline, **choose** what to launch
(the pure rule :func:`appliance.batching.policy.choose`: fixed B, priorities, deadlines, the thermal pacer's
gaps), **gather** up to B ready slots into the batch buffer (zero-padding the rest), **deliver** the replies of
the batch collected last turn, **submit** the gathered batch, and **collect** (split the outputs back, padding
dropped). A collected batch is answered at once unless the engine is idle and a full batch already waits: then
its replies wait for that batch's gather (the hand-over, see :meth:`Batcher.step`). While the engine runs batch
k, the worker processes prepare the frames of batch k+1. The slots, admission and cancellation live in
:mod:`appliance.batching.inbox`.

Tests drive :meth:`Batcher.step` directly on a manual clock; the daemon runs it in a loop on the engine thread
(:meth:`Batcher.start`), which loads, warms up and owns the engine.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from appliance.batching.inbox import BatchObserver, Inbox, QueueStats
from appliance.batching.pacer import Pacer
from appliance.batching.policy import backlog_stall, choose, coming_wait, may_burst
from appliance.batching.work import ItemState, WorkItem
from appliance.clock import Clock
from appliance.config import BatcherConfig
from appliance.engines.base import Engine
from appliance.errors import EngineDeadError, EngineError, Unavailable

__all__ = ["Batcher", "BatcherConfig", "BatchObserver", "Pacer", "QueueStats"]

log = logging.getLogger(__name__)

#: Batches whose fastest engine time is the floor a deadline refusal uses (inbox.Inbox.expected_wait_s): enough
#: to keep an idle batch (the ONNX Runtime engine bursts on idle cores) through a few seconds of slower ones.
_FLOOR_BATCHES = 128

#: One submitted batch: the engine's ticket, its frames, and when it was submitted.
InFlight = tuple[object, list[WorkItem], float, float]  # ticket, items, t0, pacer charge


class Batcher(Inbox):
    """The inbox plus the engine loop that owns the engine. See the module docstring.

    Threads start in :meth:`start`, never in the constructor. ``stage_lock`` (sequential mode) is held around
    every engine run; the worker pool holds the same lock around every file it parses and every frame it decodes,
    so no preprocessing overlaps an engine run or another file's preprocessing.
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
        super().__init__(engine.batch_size, tuple(engine.item_shape), config, clock=clock, pacer=pacer,
                         observer=observer, arena=arena)
        self.engine = engine
        self.on_engine_dead = on_engine_dead
        self._batch = np.zeros((self.batch_size, *engine.item_shape), dtype=np.float32)
        self._thread: threading.Thread | None = None
        self.stage_lock: threading.Lock | None = None if self.config.overlap else threading.Lock()
        self.heartbeat = self.clock.monotonic()  # last time the engine thread made progress or idled
        self.batches = 0
        self._running: list[WorkItem] = []  # the batches on the engine now (engine thread only)
        self._in_flight: collections.deque[InFlight] = collections.deque()
        self._batch_times: collections.deque[float] = collections.deque(maxlen=_FLOOR_BATCHES)  # engine s, newest last
        self._collected: collections.deque[WorkItem] = collections.deque()  # computed, not yet answered
        self._idle_since = self.clock.monotonic()  # when the last batch in flight was collected
        # Whether no DICOM is being preprocessed right now (the app wires the worker pool's ``idle``): one input of
        # the rule for the engine's burst threads (Engine.set_burst; the rule is policy.may_burst).
        self.preprocessing_idle: Callable[[], bool] = lambda: False
        # Cores the preprocessing has while a batch runs on the engine's own threads (the app wires the smaller of
        # the worker count and the cores the engine leaves): the burst rule weighs the expected decoding by it.
        self.preprocess_cores = 1

    # ---- the engine thread ------------------------------------------------------------------------------

    @property
    def _depth(self) -> int:
        """Batches that may be in flight: TensorRT 2, ONNX Runtime 1.

        TensorRT copies batch k+1 while batch k computes. Asked of the engine each time: ``backend = "auto"``
        only knows once :meth:`start` has loaded it.
        """
        return max(1, int(self.engine.max_in_flight))

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
        # the deadline floor waits for real batches: these run while the preprocessing workers start (65 ms a batch
        # where 35-40 ms followed), and refused 50 ms deadlines on an idle box that answered in 40-48 ms
        self.batch_s_floor = 0.0

    def _choose(self, now: float) -> tuple[list[WorkItem] | None, float]:
        """Return (items to launch now, or None) and how long to wait otherwise. Called under the lock."""
        b = self.batch_s_estimate
        coming = self._coming()
        rate = self._arrival_rate(now)
        self.partners.expire(now)
        if self._ready and coming == 0 and len(self._ready) < self.batch_size:
            self.partners.alone(min(now if r.t_ready is None else r.t_ready for r in self._ready), now)
        decision = choose(
            self._ready,
            now,
            batch_size=self.batch_size,
            batch_s=b,
            pace_delay_s=self.pacer.delay(b) if self._ready else 0.0,
            pace_gap_s=self.pacer.gap(b),
            max_wait_s=self.config.max_wait_s,
            stopping=self._stopping,
            coming=coming,
            coming_wait_s=math.inf if self.stage_lock is not None else coming_wait(
                batch_s=b, batch_size=self.batch_size, ready=len(self._ready), coming=coming,
                preprocess_s=self.preprocess_s_estimate, cores=self.preprocess_cores),
            arrival_rate=rate,
            idle_since=now if self._in_flight else self._idle_since,
            partner_odds=self.partners.expected(rate),
            stall_s=None if self.stage_lock is not None else backlog_stall(
                batch_size=self.batch_size, ready=len(self._ready), coming=coming,
                preprocess_s=self.preprocess_s_estimate, cores=self.preprocess_cores),
            last_ready=self.last_ready,
        )
        if decision.launch is None:
            return None, decision.wait_s
        return [self._ready[i] for i in decision.launch], 0.0

    def step(self, *, block: bool = True) -> float | None:
        """One turn of the engine loop: expire -> choose -> gather -> deliver -> run -> collect.

        NOTE (hand-over between batches): when a full batch already waits as one batch finishes and no other batch
        is on the engine, the finished batch's replies are delivered only after the next batch is gathered, at the
        start of the next turn (with a batch still on the engine, they are delivered at once: it keeps running).
        Delivering wakes the event loop, and a gather that runs after that shares the cores and the GIL with the
        replies it sent: measured at 16 clients, the next batch then started 5.4-5.9 ms after the last one ended,
        against 1.4-1.5 ms this way (docs/performance.md, "Where the idle core goes").

        Args:
            block: when there is nothing to do, wait on the inbox (up to the policy's wait) before returning.

        Returns:
            None when the loop is over (stopped with nothing unfinished, or the engine is dead); else the
            seconds the policy would wait before something can launch (0.0 after doing work).
        """
        with self._cond:
            now = self.clock.monotonic()
            self.heartbeat = now
            expired = self._expire(now)
            items: list[WorkItem] | None = None
            wait = 0.1
            if len(self._in_flight) < self._depth:
                items, wait = self._choose(now)
            if items is None and not expired and not self._in_flight and not self._collected:
                if self._stopping and self._unfinished == 0:
                    return None
                if block:
                    self._cond.wait(timeout=max(wait, 1e-4))
                return wait
            charge = self.pacer.launch(self.batch_s_estimate) if items else 0.0  # the bucket refills while it runs
            for item in items or ():
                self._ready.remove(item)
                item.state = ItemState.RUNNING
                item.t_launch = now
        for item in expired:
            self._finish(item)
        if items:
            self._gather(items)
        self._deliver()
        if items:
            self._submit(items, charge)
        if self._in_flight and (not items or len(self._in_flight) >= self._depth):
            self._collect(*self._in_flight.popleft())
            with self._cond:  # hold only while the engine has nothing else to run and a full batch waits
                hold = not self._in_flight and len(self._ready) >= self.batch_size
            if not hold:
                self._deliver()
        return None if self.dead is not None else 0.0

    def _loop(self) -> None:
        try:
            while self.step() is not None:
                pass
        except Exception as e:  # a bug on the engine thread: nothing would ever run again, so say so loudly
            log.critical("engine thread failed", exc_info=e)
            error = EngineDeadError(f"engine thread failed: {type(e).__name__}: {e}")
            self._deliver()  # computed before the failure: their results stand
            with self._cond:  # chosen, gathered or on the engine: nothing else will ever answer them
                stranded = [item for request in self._requests for item in request.items
                            if item.state == ItemState.RUNNING]
            for item in stranded:
                item.state, item.error = ItemState.FAILED, error
                self._finish(item)
            self._running = []
            self._die(error)

    def _gather(self, items: list[WorkItem]) -> None:
        """Gather ``items`` into the batch buffer, pad, and free their slots."""
        n = len(items)
        np.take(self._arena, [i.slot for i in items], axis=0, out=self._batch[:n])
        self._batch[n:] = 0.0  # explicit padding rows; their outputs are dropped in _collect
        with self._cond:
            for item in items:
                self._release(item)
            self._cond.notify_all()

    def _submit(self, items: list[WorkItem], charge: float) -> None:
        """Submit the gathered batch to the engine (the ONNX Runtime CPU engine runs it now).

        ``charge`` is what the pacer took at launch; a batch the engine refuses gives it back.
        """
        with self._cond:
            rate = self._arrival_rate(self.clock.monotonic(), decoded=True)
            backlog = len(self._ready)  # decoded frames already waiting for the engine beyond this batch
            coming = self._coming()
            preprocess_s = self.preprocess_s_estimate
        self._running = [*self._running, *items]
        t0 = self.clock.monotonic()
        lock = self.stage_lock if self.stage_lock is not None else contextlib.nullcontext()
        with lock:  # submit copies the batch out: the buffer is free again afterwards
            self.engine.set_burst(may_burst(sequential=self.stage_lock is not None,
                                            preprocessing_idle=self.preprocessing_idle(),
                                            arrival_rate=rate, batch_s=self.batch_s_estimate,
                                            backlog=backlog, batch_size=self.batch_size, coming=coming,
                                            preprocess_s=preprocess_s, cores=self.preprocess_cores))
            ok, ticket = self._engine_call(items, self.engine.submit, self._batch)
        if ok:
            self._in_flight.append((ticket, items, t0, charge))
        else:
            self.pacer.consume(0.0, charge)

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

    def _collect(self, ticket: object, items: list[WorkItem], t0: float, charge: float) -> None:
        """Wait for a submitted batch and split its rows back to its frames."""
        ok, outputs = self._engine_call(items, self.engine.result, ticket)
        with self._cond:  # the frames left alone that this batch took are watched no longer (policy.PartnerOdds)
            self.partners.answered(t0, self.clock.monotonic())
        if not self._in_flight:
            self._idle_since = self.clock.monotonic()  # the engine has nothing left to do
        if not ok:
            return
        engine_s = self.clock.monotonic() - t0
        self.heartbeat = self.clock.monotonic()
        self.pacer.consume(engine_s, charge)
        self.batch_s_estimate = 0.8 * self.batch_s_estimate + 0.2 * engine_s
        self._batch_times.append(engine_s)
        self.batch_s_floor = min(self._batch_times)
        self.batches += 1
        n = len(items)
        self.observer.on_batch(n, self.batch_size, engine_s)
        # NOTE: the only loop that splits a batch back into replies. Rows n..B-1 are padding: dropped here.
        for row, item in enumerate(items):
            item.outputs = {name: value[row].copy() for name, value in outputs.items()}
            item.engine_ms = engine_s * 1000.0
            item.state = ItemState.DONE
        self._running = [i for i in self._running if i not in items]
        self._collected.extend(items)  # answered by _deliver, after the next gather when one is due

    def _deliver(self) -> None:
        """Answer the frames of the collected batches."""
        while self._collected:
            self._finish(self._collected.popleft())

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
        self._deliver()
        with self._cond:
            self.dead = error
            self._accepting = False
            requests = list(self._requests)
        self.fail_pending(Unavailable("engine is dead; the service is restarting", reason="ENGINE_DEAD"), requests)
        if self.on_engine_dead is not None:
            self.on_engine_dead(error)

    def engine_cores(self) -> int:
        """Host cores a batch computes on now: 0 while none runs, else the engine's ``host_cores()``.

        Lock-free: the pool reads it before every frame.
        """
        return self.engine.host_cores() if self._running else 0

    @property
    def engine_thread_alive(self) -> bool:
        """True while the engine thread runs (loading, warming up or looping)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the engine thread (after :meth:`drain`)."""
        with self._cond:
            self._stopping = True
            self._accepting = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
