"""Admission of a parsed file against a client's cancel: all or nothing, whichever thread gets there first.

A file's slots are reserved on the worker pool's supervisor thread while the event loop may cancel the request
(client gone, deadline). ``RequestPath._admit`` and ``RequestPath._drop`` exclude each other, so a cancel either
comes first (nothing is reserved) or frees every reserved slot, and a refused reservation leaves no frames behind.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from appliance.batching.batcher import Batcher, BatcherConfig
from appliance.batching.work import ItemState, Priority, Request
from appliance.clock import ManualClock
from appliance.config import WorkersConfig
from appliance.engines.fake import FakeEngine
from appliance.errors import LimitExceeded, Overloaded, Unavailable
from appliance.serving.analyze import PathLimits, RequestPath
from appliance.workers.pool import Job, WorkerPool

CANCEL = Unavailable("client cancelled", reason="CANCELLED")


def _path(manifest: Any, capacity: int = 8) -> RequestPath:
    clock = ManualClock(100.0)
    engine = FakeEngine(manifest, manifest.artifact(), {"clock": clock})
    engine.load()
    batcher = Batcher(engine, BatcherConfig(queue_capacity=capacity), clock=clock)
    pool = WorkerPool(spec=None, config=WorkersConfig(), workers=1, batcher=batcher,  # type: ignore[arg-type]
                      clock=clock)  # never started: only its cancel() is used
    limits = PathLimits(max_message_bytes=1 << 20, inflight_bytes=1 << 20, default_deadline_s=10.0)
    return RequestPath(model=None, pipelines=frozenset({"stub"}), default_pipeline="stub",  # type: ignore[arg-type]
                       pool=pool, batcher=batcher, postprocess=None, clock=clock,  # type: ignore[arg-type]
                       limits=limits, check_admitting=lambda: None)


def _job(name: str = "r") -> Job:
    request = Request(name, "stub", Priority.BATCH, None, 100.0)
    return Job(request, b"DICM", "stub", admit=lambda n, uid: [], fail=lambda e: None)


def test_a_cancel_before_admission_reserves_nothing(fake_manifest: Any) -> None:
    path, job = _path(fake_manifest), _job()
    path._drop(job.request, job, CANCEL)
    with pytest.raises(Unavailable, match="cancelled"):
        path._admit(job, 3, "1.2.3", keep_free=0)
    assert job.request.items == [] and path.batcher.statistics().depth == 0


def test_a_cancel_after_admission_frees_every_slot(fake_manifest: Any) -> None:
    path, job = _path(fake_manifest), _job()
    items = path._admit(job, 3, "1.2.3", keep_free=0)
    assert [i.slot >= 0 for i in items] == [True] * 3 and path.batcher.statistics().depth == 3
    path._drop(job.request, job, CANCEL)
    assert all(i.state == ItemState.CANCELLED for i in items)
    assert path.batcher.statistics().depth == 0 and path.batcher.unfinished == 0


@pytest.mark.parametrize("frames, error", [(9, LimitExceeded), (5, Overloaded)])
def test_a_refused_admission_leaves_no_frames_for_a_later_cancel(fake_manifest: Any, frames: int,
                                                                 error: type[Exception]) -> None:
    path = _path(fake_manifest)
    path._admit(_job("first"), 4, "1.2.3", keep_free=0)  # 4 of 8 slots in use
    job = _job()
    with pytest.raises(error):
        path._admit(job, frames, "1.2.4", keep_free=0)  # 9: more than the inbox holds; 5: more than is free
    assert job.request.items == []
    path._drop(job.request, job, CANCEL)  # the client leaves too: nothing of this request is counted
    assert path.batcher.statistics().depth == 4 and path.batcher.unfinished == 4


class _PausingBatcher(Batcher):
    """Holds every reservation at its start until ``go`` is set: a cancel can arrive in the middle of one."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.entered, self.go = threading.Event(), threading.Event()

    def reserve(self, request: Request, **keep: Any) -> None:
        self.entered.set()
        assert self.go.wait(5)
        super().reserve(request, **keep)


def test_a_cancel_in_the_middle_of_an_admission_waits_for_it_then_frees_every_slot(fake_manifest: Any) -> None:
    path, job = _path(fake_manifest), _job()
    batcher = _PausingBatcher(path.batcher.engine, path.batcher.config, clock=path.clock)
    path.batcher = batcher
    admitting = threading.Thread(target=path._admit, args=(job, 2, "1.2.3"), kwargs={"keep_free": 0})
    admitting.start()
    assert batcher.entered.wait(5)  # the frames exist, their slots are not reserved yet
    cancelling = threading.Thread(target=path._drop, args=(job.request, job, CANCEL))
    cancelling.start()
    cancelling.join(0.2)  # (were it not held back, it would cancel frames that hold no slot yet)
    batcher.go.set()
    admitting.join(5)
    cancelling.join(5)
    assert [i.state for i in job.request.items] == [ItemState.CANCELLED] * 2
    assert batcher.statistics().depth == 0 and batcher.unfinished == 0


def test_a_stream_admission_cancelled_on_the_event_loop_is_answered_unavailable(fake_manifest: Any) -> None:
    path, job = _path(fake_manifest), _job()
    job.request.deadline = path.clock.monotonic() + 60.0  # far off: only the cancel ends the wait
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    waiting = threading.Event()

    async def window(n_frames: int) -> None:  # a stream's frame window that never opens
        waiting.set()
        await asyncio.Event().wait()

    def cancel_all() -> None:  # as at shutdown: every task on the loop is cancelled
        for task in asyncio.all_tasks(loop):
            task.cancel()

    try:
        threading.Thread(target=lambda: (waiting.wait(5), loop.call_soon_threadsafe(cancel_all))).start()
        with pytest.raises(Unavailable, match="cancelled"):
            path._admit_stream(loop, job, 2, "1.2.3", window)
        assert job.request.items == [] and path.batcher.statistics().depth == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def test_a_drain_waits_for_a_call_still_waiting_for_queue_room_and_answers_it_unavailable(fake_manifest: Any) -> None:
    """Session 18: a call waiting for queue room (or the byte budget, or a frame window) was not yet among the
    requests a drain waits for; it is counted from the moment it enters, and a drain answers it UNAVAILABLE."""
    draining = threading.Event()

    def check_admitting() -> None:
        if draining.is_set():
            raise Unavailable("service is draining", reason="DRAINING")

    path = _path(fake_manifest)
    path._check_admitting = check_admitting
    path.pool.unadmitted = lambda: 10**6  # type: ignore[method-assign]  # the workers' queue stays full

    async def scenario() -> tuple[bool, BaseException | None, bool]:
        call = asyncio.ensure_future(path.analyze(b"DICM", request_id="r", pipeline="stub", wait_for_budget=True))
        await asyncio.sleep(0.05)  # inside analyze, waiting for queue room
        idle_while_waiting = await path.wait_idle(0.0)
        draining.set()
        error = None
        try:
            await asyncio.wait_for(call, 5)
        except BaseException as e:  # noqa: BLE001
            error = e
        return idle_while_waiting, error, await path.wait_idle(0.0)

    idle_while_waiting, error, idle_after = asyncio.run(scenario())
    assert not idle_while_waiting
    assert isinstance(error, Unavailable) and "draining" in str(error)
    assert idle_after


def test_a_stream_admission_waits_for_room_in_the_inbox_instead_of_being_refused(fake_manifest: Any) -> None:
    """Held-out review, session 18: a stream of 64-frame files beside light unary clients had items refused "inbox
    full: 1 of 64 slots in use"; a stream waits for room as it waits for its window."""
    path = _path(fake_manifest)  # 8 slots
    other = _job("other")
    path._admit(other, 6, "1.2.3", keep_free=0)  # another client's frames: 2 slots free
    job = _job("stream")
    job.request.deadline = path.clock.monotonic() + 60.0
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()

    async def window(n_frames: int) -> None:  # the stream's own window is open
        return None

    def free_later() -> None:
        threading.Event().wait(0.2)
        path._drop(other.request, other, CANCEL)  # the other client's frames are done: their slots come back

    try:
        threading.Thread(target=free_later).start()
        items = path._admit_stream(loop, job, 4, "1.2.4", window)
        assert len(items) == 4 and path.batcher.statistics().depth == 4
        assert path.batcher.statistics().rejected == 0  # it waited: nothing was refused
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def test_queue_full_advises_a_retry_after_the_requests_waiting_for_the_workers(fake_manifest: Any) -> None:
    """Held-out review, session 18: the advised retry counted only the inbox (40-46 ms) where the 64 requests waiting
    for a worker needed 0.7 s, so clients that honoured it came back as a storm."""
    path = _path(fake_manifest)
    path.pool.unadmitted = lambda: 64  # type: ignore[method-assign]  # the bound (max_unadmitted 64) is reached
    path.batcher.preprocess_s_estimate = 0.02  # 20 ms a file, 1 worker: 1.28 s for the queue ahead

    async def refused() -> Overloaded:
        with pytest.raises(Overloaded) as e:
            await path._gate.room(path.clock.monotonic() + 10.0, wait=False)
        return e.value

    error = asyncio.run(refused())
    assert error.reason == "QUEUE_FULL" and error.retry_after_s is not None and error.retry_after_s >= 1.28


def test_a_cancel_at_the_clients_deadline_is_counted_deadline_exceeded(fake_manifest: Any) -> None:
    """Held-out review, session 18: gRPC ends a call at its deadline by cancelling the handler, racing this path's own
    timer, and 76 of 194 expiries were counted CANCELLED (a client cancel) instead of DEADLINE_EXCEEDED."""
    path = _path(fake_manifest)
    counted: list[str] = []
    path._on_finished = lambda code, seconds: counted.append(code)
    for advance, expected in ((0.3, "DEADLINE_EXCEEDED"), (0.1, "CANCELLED")):
        t0 = path.clock.monotonic()
        with pytest.raises(asyncio.CancelledError), path._counted(t0, time_remaining=0.3):
            path.clock.advance(advance)
            raise asyncio.CancelledError
        assert counted[-1] == expected
    with pytest.raises(asyncio.CancelledError), path._counted(path.clock.monotonic()):  # no deadline: the client's
        raise asyncio.CancelledError
    assert counted == ["DEADLINE_EXCEEDED", "CANCELLED", "CANCELLED"]


def test_batch_requests_leave_room_at_the_workers_for_interactive_ones(fake_manifest: Any) -> None:
    """Held-out review, session 18: behind 70 BATCH calls on one connection, 9 of 20 INTERACTIVE calls were refused
    QUEUE_FULL. BATCH requests may fill BATCH_SHARE of the requests-waiting-for-a-worker bound; the rest is kept."""
    from appliance.batching.work import Priority
    from appliance.serving.admission import BATCH_SHARE

    path = _path(fake_manifest)
    waiting = int(path.limits.max_unadmitted * BATCH_SHARE)  # 48 of 64
    path.pool.unadmitted = lambda: waiting  # type: ignore[method-assign]

    async def scenario() -> None:
        with pytest.raises(Overloaded, match="for BATCH requests; the rest is kept for INTERACTIVE ones") as e:
            await path._gate.room(path.clock.monotonic() + 10.0, wait=False, priority=Priority.BATCH)
        assert e.value.reason == "QUEUE_FULL"
        await path._gate.room(path.clock.monotonic() + 10.0, wait=False, priority=Priority.INTERACTIVE)  # admitted

    asyncio.run(scenario())


def test_a_deadline_too_near_for_the_requests_ahead_at_the_workers_is_refused_at_once(fake_manifest: Any) -> None:
    """Held-out review, session 18: the deadline was judged only once a worker had taken the file, against the
    inbox alone; behind a BATCH backlog, deadlines of 50-200 ms waited for a worker and ended DEADLINE_EXCEEDED."""
    path = _path(fake_manifest)
    path.pool.ahead = lambda priority, source: 40  # type: ignore[method-assign]
    path.batcher.preprocess_s_estimate = 0.02  # 20 ms a file, 1 worker: 0.82 s before its own frame is done
    path.batcher.batch_s_floor = 0.03
    now = path.clock.monotonic()

    async def refused(deadline_in: float) -> Overloaded:
        with pytest.raises(Overloaded) as e:
            await path._gate.room(now + deadline_in, wait=False, priority=Priority.BATCH, source="a")
        return e.value

    error = asyncio.run(refused(0.5))
    assert error.reason == "DEADLINE_UNMEETABLE" and "40 requests ahead" in str(error)
    assert error.retry_after_s is not None and error.retry_after_s >= 0.85
    assert path.batcher.statistics().rejected == 1
    asyncio.run(path._gate.room(now + 1.0, wait=False, priority=Priority.BATCH, source="a"))  # 0.85 s: it may
    path.pool.ahead = lambda priority, source: 0  # type: ignore[method-assign]
    asyncio.run(path._gate.room(now + 0.06, wait=False, source="a"))  # idle: 20 ms + 30 ms
    idle = asyncio.run(refused(0.04))  # nothing queued: a retry with the same deadline fails again (session 19)
    assert idle.retry_after_s is None and "nothing is queued: a deadline under 50 ms cannot be met" in str(idle)
    asyncio.run(path._gate.room(now + 0.04, wait=True, source="a"))  # a stream's item waits for room instead


def test_batch_requests_leave_room_in_the_inbox_for_interactive_ones(fake_manifest: Any) -> None:
    """Held-out review, session 18: INTERACTIVE requests had reserved room only at the workers; a BATCH backlog of
    multi-frame files still filled the inbox, and INTERACTIVE files were parsed only to be refused "inbox full"."""
    path = _path(fake_manifest)  # 8 slots: BATCH may fill 6
    keep = path._keep_free("batch-client", Priority.BATCH)
    path._admit(_job("b1"), 5, "1.2.1", *keep)
    with pytest.raises(Overloaded, match=r"inbox full: 5 of 8 slots in use, the last 2 kept for INTERACTIVE "
                                         r"requests") as e:
        path._admit(_job("b2"), 2, "1.2.2", *keep)
    assert e.value.reason == "QUEUE_FULL"
    path._admit(_job("b3"), 1, "1.2.3", *keep)  # the sixth slot
    interactive = Job(Request("i1", "stub", Priority.INTERACTIVE, None, 100.0), b"DICM", "stub",
                      admit=lambda n, uid: [], fail=lambda e: None)
    assert len(path._admit(interactive, 2, "1.2.4", *path._keep_free("other", Priority.INTERACTIVE))) == 2
    assert path.batcher.statistics().depth == 8


def test_a_call_inside_the_path_when_a_drain_begins_is_still_admitted(fake_manifest: Any) -> None:
    """Held-out review, session 19: a request whose file a worker was parsing when SIGTERM came was answered
    DRAINING with 9.9 s of the grace left; only calls that arrive after it are refused (at the path's door)."""
    path = _path(fake_manifest)
    state = {"reason": "DRAINING"}

    def check_admitting() -> None:
        raise Unavailable("service is draining", reason=state["reason"])

    path._check_admitting = check_admitting
    assert len(path._admit(_job("inside"), 2, "1.2.3", keep_free=0)) == 2
    state["reason"] = "THERMAL_PAUSE"  # any other refusal still holds for it
    with pytest.raises(Unavailable, match="draining"):
        path._admit(_job("paused"), 1, "1.2.4", keep_free=0)
    with pytest.raises(Unavailable):
        asyncio.run(path.analyze(b"DICM", request_id="late", pipeline="stub"))  # a new call: refused at the door
