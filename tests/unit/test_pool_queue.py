"""The worker pool without worker processes: its queue (INTERACTIVE first, cancelled and expired jobs skipped,
senders in turn) and, in sequential mode, the stage lock around each step of a job's conversation."""

from __future__ import annotations

import threading

import pytest

from appliance.batching.batcher import Batcher, BatcherConfig
from appliance.batching.work import ItemState, Priority, Request, WorkItem
from appliance.clock import ManualClock
from appliance.config import WorkersConfig
from appliance.errors import ApplianceError, DeadlineExceeded, Overloaded, Unavailable
from appliance.workers.pool import Job, WorkerPool, _WorkerLost
from tests.unit.test_batcher import Pipelined


def _job(name: str, priority: Priority, deadline: float | None = None,
         failed: dict[str, ApplianceError] | None = None, done: threading.Event | None = None) -> Job:
    req = Request(name, "stub", priority, deadline, 0.0)  # n_frames 0: not parsed yet

    def fail(error: ApplianceError) -> None:
        if failed is not None:
            failed[name] = error
        if done is not None:
            done.set()

    return Job(req, b"", "stub", admit=lambda n, uid: [], fail=fail)


class _Arrivals:
    """The one thing a queued job tells the batcher: a request arrived (its partner wait, policy.PartnerOdds)."""

    def __init__(self) -> None:
        self.arrivals = 0

    def note_arrival(self) -> None:
        self.arrivals += 1


def _pool(clock: ManualClock) -> WorkerPool:
    # never started: no supervisor threads, no processes; _next_job is what each supervisor calls
    return WorkerPool(spec=None, config=WorkersConfig(), workers=1, batcher=_Arrivals(), clock=clock)


def test_interactive_jobs_are_taken_before_earlier_batch_jobs_oldest_first() -> None:
    pool = _pool(ManualClock())
    for job in (_job("b1", Priority.BATCH), _job("b2", Priority.BATCH), _job("i1", Priority.INTERACTIVE),
                _job("i2", Priority.INTERACTIVE)):
        pool.submit(job)
    order = [pool._next_job().request.request_id for _ in range(4)]
    assert order == ["i1", "i2", "b1", "b2"]
    assert pool.statistics().busy == 4 and pool.statistics().queued == 0


def test_cancelled_and_expired_jobs_are_skipped_and_the_expired_one_answered() -> None:
    clock = ManualClock(10.0)
    pool = _pool(clock)
    failed: dict[str, ApplianceError] = {}
    answered = threading.Event()
    cancelled = _job("c", Priority.INTERACTIVE)
    pool.submit(cancelled)
    pool.submit(_job("late", Priority.INTERACTIVE, deadline=10.5, failed=failed, done=answered))
    pool.submit(_job("ok", Priority.BATCH))
    pool.cancel(cancelled)
    clock.advance(1.0)
    assert pool._next_job().request.request_id == "ok"
    assert answered.wait(5)
    assert isinstance(failed["late"], DeadlineExceeded)
    assert pool.unadmitted() == 1  # "ok" is being parsed: nothing admitted for it yet


def test_idle_means_no_job_waits_and_no_worker_parses_or_decodes() -> None:
    pool = _pool(ManualClock())
    assert pool.idle()
    pool.submit(_job("a", Priority.BATCH))
    assert not pool.idle()  # queued
    pool._next_job()  # a supervisor took it ...
    assert pool.idle()  # ... but has not sent it yet
    pool._stepping[0] = True  # the worker parses or decodes
    assert not pool.idle()
    pool._stepping[0] = False  # the reply came back; the job's drop message is not work
    assert pool.idle()


def test_a_flooding_sender_waits_its_turn_behind_a_later_sender() -> None:
    pool = _pool(ManualClock())
    for i in range(6):
        job = _job(f"flood{i}", Priority.BATCH)
        job.source = "ipv4:10.0.0.9:51000"
        pool.submit(job)
    lone = _job("lone", Priority.BATCH)
    lone.source = "ipv4:10.0.0.7:42000"
    pool.submit(lone)
    assert pool.unadmitted() == 7 and pool.statistics().queued == 7
    order = [pool._next_job().request.request_id for _ in range(3)]
    assert order == ["flood0", "lone", "flood1"]
    pool.cancel(lone)  # already taken: nothing queued changes
    assert pool.statistics().queued == 4


class _Pipe:
    """The daemon's end of a worker pipe that answers at once and records whether ``lock`` was held at each send."""

    def __init__(self, lock: threading.Lock, replies: list[tuple[object, ...]]) -> None:
        self.lock, self.replies = lock, replies
        self.sent: list[tuple[object, bool]] = []
        self.messages: list[tuple[object, ...]] = []

    def send(self, msg: tuple[object, ...]) -> None:
        self.sent.append((msg[0], self.lock.locked()))
        self.messages.append(msg)

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(("bytes", self.lock.locked()))

    def poll(self, timeout: float) -> bool:
        return True

    def recv(self) -> tuple[object, ...]:
        return self.replies.pop(0)


class _Batcher:
    def __init__(self, skip: frozenset[int] = frozenset()) -> None:
        self.ready: list[tuple[float, float]] = []
        self.skip = skip  # frame indexes whose request was cancelled before they were decoded

    def begin_frame(self, item: WorkItem) -> bool:
        return item.frame_index not in self.skip

    def frame_ready(self, item: WorkItem, info: object, ms: float, parse_ms: float) -> None:
        item.state = ItemState.READY
        self.ready.append((ms, parse_ms))

    def note_arrival(self) -> None:
        pass


def test_sequential_mode_holds_the_stage_lock_while_a_file_is_parsed_and_while_a_frame_is_decoded() -> None:
    lock = threading.Lock()
    batcher = _Batcher()
    pool = WorkerPool(spec=None, config=WorkersConfig(), workers=1, batcher=batcher,  # type: ignore[arg-type]
                      clock=ManualClock(), stage_lock=lock)
    pool._procs[0] = None  # type: ignore[assignment]  # _run only names it when retiring a worker
    item = WorkItem(Request("r", "stub", Priority.BATCH, None, 0.0), 0, slot=3)
    job = Job(item.request, b"DICM", "stub", admit=lambda n, uid: [item], fail=lambda e: None)
    pipe = _Pipe(lock, [("parsed", job.id, 1, "1.2.3", 0, 0.5), ("frame", job.id, None, 1.0, 0)])
    runner = threading.Thread(target=pool._run, args=(pipe, job), name="worker-0")
    runner.start()
    runner.join(5)
    # the only frame is the last: the worker forgets the instance with its answer, so no drop message follows
    assert pipe.sent == [("parse", True), ("bytes", True), ("frame", True)]
    assert pipe.messages[-1] == ("frame", job.id, 0, 3, True, 1)  # one core: the frame decodes on one thread
    assert item.state == ItemState.READY
    assert batcher.ready == [(1.0, 0.5)]  # the file's parse time reaches the batcher with its first frame


def _run_frames(n_frames: int, skip: frozenset[int]) -> _Pipe:
    """Run a job of ``n_frames`` frames (those in ``skip`` cancelled before decoding) against a pipe that answers."""
    pool = WorkerPool(spec=None, config=WorkersConfig(), workers=1, batcher=_Batcher(skip),  # type: ignore[arg-type]
                      clock=ManualClock())
    pool._procs[0] = None  # type: ignore[assignment]
    request = Request("r", "stub", Priority.BATCH, None, 0.0)
    items = [WorkItem(request, i, slot=i) for i in range(n_frames)]
    job = Job(request, b"DICM", "stub", admit=lambda n, uid: items, fail=lambda e: None)
    decoded = [("frame", job.id, None, 1.0, 0)] * (n_frames - len(skip))
    pipe = _Pipe(threading.Lock(), [("parsed", job.id, n_frames, "1.2.3", 0, 0.5), *decoded])
    runner = threading.Thread(target=pool._run, args=(pipe, job), name="worker-0")
    runner.start()
    runner.join(5)
    return pipe


def test_only_the_last_frame_message_tells_the_worker_to_forget_the_instance() -> None:
    pipe = _run_frames(3, frozenset())
    assert [m for m in pipe.messages if m[0] != "parse"] == [
        ("frame", pipe.messages[0][1], 0, 0, False, 1), ("frame", pipe.messages[0][1], 1, 1, False, 1),
        ("frame", pipe.messages[0][1], 2, 2, True, 1)]


def test_a_job_whose_last_frame_is_skipped_ends_with_a_drop_message() -> None:
    pipe = _run_frames(3, frozenset({2}))  # cancelled after two frames were decoded
    job_id = pipe.messages[0][1]
    assert [m for m in pipe.messages if m[0] != "parse"] == [
        ("frame", job_id, 0, 0, False, 1), ("frame", job_id, 1, 1, False, 1), ("drop", job_id)]


def test_a_worker_that_cannot_be_replaced_for_a_job_answers_it_unavailable_not_as_a_bad_file() -> None:
    pool = _pool(ManualClock())
    failed: dict[str, ApplianceError] = {}
    job = _job("j", Priority.BATCH, failed=failed)

    def spawn(index: int) -> None:
        raise _WorkerLost("start", Overloaded("decoding ran past its time budget", retry_after_s=None))

    pool._spawn = spawn  # type: ignore[assignment,method-assign]
    with pytest.raises(_WorkerLost):
        pool._respawn_for(0, job)
    assert isinstance(failed["j"], Unavailable) and failed["j"].reason == "DECODER_LOST"


def _spare_pool(cores: int, decoder_threads: int = 0, workers: int = 2,
                stage_lock: threading.Lock | None = None) -> WorkerPool:
    return WorkerPool(spec=None, config=WorkersConfig(decoder_threads=decoder_threads),  # type: ignore[arg-type]
                      workers=workers, batcher=_Batcher(), clock=ManualClock(), stage_lock=stage_lock, cores=cores)


def test_a_frame_decodes_on_every_core_that_nothing_else_uses() -> None:
    pool = _spare_pool(cores=4)
    assert pool.spare_cores(0) == 4  # an idle box: the frame takes all of it
    pool._stepping[0] = True
    assert pool.spare_cores(0) == 4  # worker 0's own step is this frame
    pool._stepping[1] = True
    assert pool.spare_cores(0) == 3  # the other worker is decoding
    pool.engine_cores = lambda: 1
    assert pool.spare_cores(0) == 2  # and a batch computes on one core
    pool.engine_cores = lambda: 4
    assert pool.spare_cores(0) == 1  # never fewer than one
    pool._stepping[1] = False
    pool.engine_cores = lambda: 0
    pool.submit(_job("q", Priority.BATCH))
    assert pool.spare_cores(0) == 1  # a job waits for a worker: the other core is about to be taken


def test_decoder_threads_cap_the_spare_cores_and_one_turns_them_off() -> None:
    assert _spare_pool(cores=8, decoder_threads=2).spare_cores(0) == 2
    assert _spare_pool(cores=8, decoder_threads=1).spare_cores(0) == 1
    assert _spare_pool(cores=2, decoder_threads=16).spare_cores(0) == 2  # no more threads than cores
    assert _spare_pool(cores=1).spare_cores(0) == 1


def test_in_sequential_mode_a_frame_decodes_on_all_cores() -> None:
    pool = _spare_pool(cores=4, stage_lock=threading.Lock())
    pool.engine_cores = lambda: 1  # cannot compute while the stage lock is held for this frame
    pool._stepping[1] = True
    assert pool.spare_cores(0) == 4


def test_the_frame_message_carries_the_spare_cores() -> None:
    pool = WorkerPool(spec=None, config=WorkersConfig(), workers=1, batcher=_Batcher(),  # type: ignore[arg-type]
                      clock=ManualClock(), cores=3)
    pool._procs[0] = None  # type: ignore[assignment]
    pool.engine_cores = lambda: 1
    item = WorkItem(Request("r", "stub", Priority.BATCH, None, 0.0), 0, slot=2)
    job = Job(item.request, b"DICM", "stub", admit=lambda n, uid: [item], fail=lambda e: None)
    pipe = _Pipe(threading.Lock(), [("parsed", job.id, 1, "1.2.3", 0, 0.5), ("frame", job.id, None, 1.0, 0)])
    runner = threading.Thread(target=pool._run, args=(pipe, job), name="worker-0")
    runner.start()
    runner.join(5)
    assert pipe.messages[-1] == ("frame", job.id, 0, 2, True, 2)  # three cores, one computing a batch


def test_a_job_queued_for_a_worker_is_the_arrival_the_launch_rule_weighs_its_partner_wait_by(fake_manifest) -> None:
    """A request counts as coming from when it is queued for a parse (``unadmitted``), so that is when it arrives
    for the partner odds too: its admission comes only after a worker has parsed it, which may be long after."""
    clock = ManualClock(10.0)
    engine = Pipelined(fake_manifest, fake_manifest.artifact(), {"clock": clock})  # answers a turn later
    engine.load()
    batcher = Batcher(engine, BatcherConfig(max_wait_s=0.005, queue_capacity=16), clock=clock)
    pool = WorkerPool(spec=None, config=WorkersConfig(), workers=1, batcher=batcher, clock=clock)
    batcher.parsing = pool.unadmitted
    for i in range(8):
        req = Request(f"r{i}", "stub", Priority.INTERACTIVE, None, clock.monotonic(), n_frames=1)
        batcher.reserve(req)
        assert batcher.begin_frame(req.items[0])
        batcher.frame_ready(req.items[0], None, 1.0)
        batcher.step(block=False)  # one frame ready, nothing coming: left alone
        clock.advance(0.002)
        job = _job(f"p{i}", Priority.INTERACTIVE)
        pool.submit(job)  # 2 ms later another request reaches the daemon; its parse has not begun
        assert batcher._coming() == 1
        pool.cancel(job)
        batcher.step(block=False)
        clock.advance(0.05)
        batcher.step(block=False)
    assert batcher.partners.rate == pytest.approx(1 / 0.002)  # one arrival per 2 ms watched
