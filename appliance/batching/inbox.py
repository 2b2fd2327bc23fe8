"""The inbox: one slot per admitted frame, frame states, cancellation, deadlines and statistics.

The slots are a preallocated arena of ``queue_capacity`` model inputs (shared memory, see
:mod:`appliance.workers.arena`). Admission (:meth:`Inbox.reserve`) reserves one slot per frame or answers
RESOURCE_EXHAUSTED at once; a preprocessing worker writes the frame straight into its slot and the pool
reports it (:meth:`Inbox.frame_ready` / :meth:`Inbox.frame_failed`). Admitted frames that no worker has
started yet expire at their deadline too, freeing their slots. The engine loop
(:class:`appliance.batching.batcher.Batcher`) takes ready frames from here.

Thread-safety: every method may be called from any thread (event loop, pool supervisors, engine thread); one
condition variable guards the state and wakes the engine loop.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from appliance.batching.pacer import Pacer
from appliance.batching.policy import PartnerOdds
from appliance.batching.work import ItemState, Request, WorkItem
from appliance.clock import Clock, RealClock
from appliance.config import BatcherConfig
from appliance.errors import (
    ApplianceError,
    ConfigError,
    DeadlineExceeded,
    EngineDeadError,
    LimitExceeded,
    Overloaded,
    Unavailable,
)

if TYPE_CHECKING:
    from appliance.pipeline.steps import FrameInfo

__all__ = ["BatchObserver", "Inbox", "Keep", "QueueStats", "check_capacity"]

log = logging.getLogger(__name__)

#: Seconds of admissions the arrival rate (read by the launch policy) is measured over.
ARRIVAL_WINDOW_S = 1.0
#: Weight of the newest frame in the moving mean of the workers' time per frame.
PREPROCESS_EWMA = 0.02


def check_capacity(queue_capacity: int, batch_size: int) -> None:
    """ConfigError unless the inbox holds at least one full batch (``doctor --config`` asks the same)."""
    if queue_capacity < batch_size:
        raise ConfigError(f"config key batcher.queue_capacity ({queue_capacity}) must be >= the model's batch size "
                          f"({batch_size})")


class Keep(NamedTuple):
    """Inbox slots a request must leave free after it (:meth:`Inbox.reserve`), for whom, and a refusal's reason."""

    keep_free: int
    kept_for: str = "other senders"
    kept_reason: str = "SENDER_SHARE"


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


class Inbox:
    """The slot arena's bookkeeping: admission, frame states, cancellation, expiry and statistics.

    Args:
        batch_size: the model's fixed batch size B.
        item_shape: one model input's shape.
        config: ``[batcher]``.
        clock: time source (a :class:`~appliance.clock.ManualClock` in tests).
        pacer: the thermal pacer; its duty scales the wait estimate.
        observer: metrics sink.
        arena: the slot memory (the workers' shared mapping); a private array when None.
    """

    def __init__(
        self,
        batch_size: int,
        item_shape: tuple[int, ...],
        config: BatcherConfig | None = None,
        *,
        clock: Clock | None = None,
        pacer: Pacer | None = None,
        observer: BatchObserver | None = None,
        arena: np.ndarray | None = None,
    ) -> None:
        self.config = config or BatcherConfig()
        self.clock = clock or RealClock()
        self.pacer = pacer or Pacer(self.clock)
        self.observer = observer or BatchObserver()
        self.batch_size = batch_size
        cap = self.config.queue_capacity
        check_capacity(cap, batch_size)
        shape = (cap, *item_shape)
        if arena is not None and (arena.shape != shape or arena.dtype != np.float32):
            raise ValueError(f"arena must be float32 {shape}, got {arena.dtype} {arena.shape}")
        self._arena = arena if arena is not None else np.zeros(shape, dtype=np.float32)
        self._free: collections.deque[int] = collections.deque(range(cap))
        self._ready: list[WorkItem] = []
        self._cond = threading.Condition()
        self._requests: set[Request] = set()  # admitted requests with unfinished frames
        self._stopping = False
        self._accepting = True
        # requests a worker is parsing (not admitted yet): frames the next batch may wait for (set by the app)
        self.parsing: Callable[[], int] = lambda: 0
        self.dead: EngineDeadError | None = None
        self.batch_s_estimate = 0.05  # EMA of engine seconds per batch (seeded by warm-up)
        self.batch_s_floor = 0.0  # the fastest of the last batches, 0 until one ran: deadline refusals
        self._peak = 0
        self._rejected = 0
        self._unfinished = 0  # admitted frames not yet finished (running ones included)
        # (time, frames, frames a worker preprocesses) admitted
        self._arrivals: collections.deque[tuple[float, int, int]] = collections.deque()
        self._arrived = 0  # frames in _arrivals
        self._arrived_decoded = 0  # ... of them not tensor rows
        self.preprocess_s_estimate = 0.0  # moving mean of a frame's time in a worker (0 until the first frame)
        self.last_ready = -math.inf  # when a frame last became ready (the launch rule's sign of progress)
        # the arrivals seen while frames waited alone: whether the launch rule waits for a partner (policy.PartnerOdds)
        self.partners = PartnerOdds(self.config.max_wait_s)

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

    def expected_wait_s(self, extra_items: int = 0, *, fastest: bool = False) -> float:
        """Estimate seconds until ``extra_items`` more frames would be computed, at the current duty.

        ``fastest`` takes each batch at the fastest recent batch time instead of the running mean: what a deadline
        refusal needs, since refusing a request that would have made it is the worse mistake. The mean, taken while
        the preprocessing workers shared the cores, refused 50 ms deadlines on an idle box that answered in 40-48 ms
        (held-out review, session 18).
        """
        with self._cond:
            depth = self.config.queue_capacity - len(self._free)
        return math.ceil((depth + extra_items) / self.batch_size) * self.batch_wait_s(fastest=fastest)

    def batch_wait_s(self, *, fastest: bool = False) -> float:
        """Seconds one batch takes at the current duty (the fastest recent one with ``fastest``)."""
        return (self.batch_s_floor if fastest else self.batch_s_estimate) / max(self.pacer.duty, 0.05)

    def unmeetable(self, wait: float, left: float, ahead: str = "", *, queued: bool) -> Overloaded:
        """Count and return the DEADLINE_UNMEETABLE refusal of a request ``wait`` s from done with ``left`` s left.

        With nothing ``queued`` ahead of it, a retry with the same deadline fails again: no RetryInfo to loop on,
        and the message gives the shortest deadline that could be met (held-out review, session 19).
        """
        self._reject("DEADLINE_UNMEETABLE")
        return Overloaded(
            f"queue cannot meet the deadline: expected wait {wait * 1000:.0f} ms{ahead} exceeds the "
            f"{max(0.0, left) * 1000:.0f} ms left"
            + ("" if queued else f"; nothing is queued: a deadline under {wait * 1000:.0f} ms cannot be met"),
            retry_after_s=wait if queued else None,
            reason="DEADLINE_UNMEETABLE",
        )

    def reserve(self, request: Request, *, keep_free: int = 0, kept_for: str = "other senders",
                kept_reason: str = "SENDER_SHARE") -> None:
        """Admit a request: reserve one slot per frame. Its frames then wait for a worker (ADMITTED).

        ``keep_free`` slots must stay free after it, unless the inbox is empty (and never more than it leaves):
        the request path keeps the last ones for other senders (appliance.serving.admission.SENDER_SHARE), or for
        INTERACTIVE requests when this one is BATCH. A refusal because of them says ``kept_for`` and has the
        reason ``kept_reason``.

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
            wait = self.expected_wait_s(n, fastest=True)
            if now + wait > request.deadline:
                raise self.unmeetable(wait, request.deadline - now, queued=self.statistics().depth > 0)
        with self._cond:
            if self.dead is not None:
                raise Unavailable("engine is dead; the service is restarting", reason="ENGINE_DEAD")
            self.require_accepting()
            keep = min(keep_free, cap - n) if len(self._free) < cap else 0  # an empty inbox admits what fits
            if len(self._free) < n + keep:
                depth = cap - len(self._free)
                shared = keep and len(self._free) >= n  # it would fit but for the reserve it must leave
                reason = kept_reason if shared else "QUEUE_FULL"
                self._rejected += 1
                self.observer.on_rejected(reason)
                kept = f", the last {keep} kept for {kept_for}" if shared else ""
                raise Overloaded(
                    f"inbox full: {depth} of {cap} slots in use{kept} (config key batcher.queue_capacity)",
                    retry_after_s=self.batch_s_estimate * math.ceil(depth / self.batch_size),
                    reason=reason,
                )
            for item in request.items:
                item.slot = self._free.popleft()
            self._unfinished += n
            decoded = n if request.pipeline else 0  # frames a worker will preprocess (tensors need none)
            self._arrivals.append((now, n, decoded))
            if not request.pipeline:  # a tensor request arrives here; a DICOM one did when queued (note_arrival)
                self.partners.arrived(self.clock.monotonic())
            self._arrived += n
            self._arrived_decoded += decoded
            self._requests.add(request)
            self._peak = max(self._peak, cap - len(self._free))

    def note_arrival(self) -> None:
        """A request reached the daemon (queued for a worker to parse): the launch rule counts it as coming."""
        with self._cond:
            self.partners.arrived(self.clock.monotonic())

    def _arrival_rate(self, now: float, *, decoded: bool = False) -> float:
        """Frames admitted per second over the last :data:`ARRIVAL_WINDOW_S`. Called under the lock.

        ``decoded``: count only the frames a worker preprocesses, not tensor rows.
        """
        while self._arrivals and self._arrivals[0][0] < now - ARRIVAL_WINDOW_S:
            _, n, d = self._arrivals.popleft()
            self._arrived -= n
            self._arrived_decoded -= d
        return (self._arrived_decoded if decoded else self._arrived) / ARRIVAL_WINDOW_S

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

    def frame_ready(self, item: WorkItem, frame_info: FrameInfo | None, preprocess_ms: float,
                    parse_ms: float = 0.0) -> None:
        """``item``'s slot now holds its model input.

        ``preprocess_ms`` is the worker's time for the frame; ``parse_ms`` its file's parse, given with the file's
        first frame.
        """
        item.frame_info = frame_info
        item.preprocess_ms = preprocess_ms
        with self._cond:  # a moving mean of a frame's time in a worker, parse included (the burst rule reads it)
            seen = (preprocess_ms + parse_ms) / 1000.0
            old = self.preprocess_s_estimate
            self.preprocess_s_estimate = seen if old == 0.0 else old + PREPROCESS_EWMA * (seen - old)
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
                item.t_ready = self.last_ready = self.clock.monotonic()
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

    def _coming(self) -> int:
        """Frames on their way: admitted and not yet ready, plus requests still being parsed. Under the lock."""
        admitted = sum(1 for r in self._requests for i in r.items
                       if i.state in (ItemState.ADMITTED, ItemState.PREPROCESSING))
        return admitted + self.parsing()

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
    def unfinished(self) -> int:
        """Admitted frames not yet answered."""
        with self._cond:
            return self._unfinished

    def require_accepting(self) -> None:
        """UNAVAILABLE ``DRAINING`` once :meth:`stop_accepting` ran (a drain whose grace is spent, or a stop)."""
        if not self._accepting:
            raise Unavailable("service is draining", reason="DRAINING")

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
