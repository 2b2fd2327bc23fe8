"""Batching policy against the fake engine: fixed B, padding, priorities, cancellation, deadlines, pacing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from appliance.batching.batcher import Batcher, BatcherConfig, Pacer
from appliance.batching.work import ItemState, Priority, Request
from appliance.clock import ManualClock
from appliance.engines.fake import FakeEngine
from appliance.errors import EngineDeadError, EngineError, LimitExceeded, Overloaded, Unavailable
from tests.conftest import Feeder, StubInstance, StubPipeline

_FEEDERS: dict[int, Feeder] = {}


def start_batcher(batcher):
    _FEEDERS[id(batcher)] = Feeder(batcher)
    return batcher.start(warmup_runs=1)


def make_batcher(manifest, *, engine_opts=None, **cfg):
    engine = FakeEngine(manifest, manifest.artifact(), engine_opts or {})
    config = BatcherConfig(**{"max_wait_s": 0.01, "queue_capacity": 16, **cfg})
    batcher = Batcher(engine, config)
    ready = start_batcher(batcher)
    assert ready.wait(5) and batcher.start_error is None
    return batcher, engine


def submit(batcher, values, pipeline, priority=Priority.INTERACTIVE, deadline=None):
    """Admit a request of len(values) frames and let the feeder (the pool's stand-in) preprocess it."""
    done = threading.Event()
    req = Request(
        request_id=f"r{values[0]}",
        pipeline="stub",
        priority=priority,
        deadline=deadline,
        t_admit=time.monotonic(),
        n_frames=len(values),
        on_done=lambda r: done.set(),
    )
    req.instance = StubInstance(list(values))
    batcher.reserve(req)
    _FEEDERS[id(batcher)].feed(req, req.instance, pipeline)
    return req, done


@pytest.fixture
def stop_list():
    items = []
    yield items
    for b in items:
        b.stop(1.0)
        feeder = _FEEDERS.pop(id(b), None)
        if feeder is not None:
            feeder.stop()


def test_full_batch_then_padded_partial(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, max_wait_s=0.05)
    stop_list.append(batcher)
    pipe = StubPipeline()
    reqs = [submit(batcher, [0.1 * (i + 1)], pipe) for i in range(6)]
    for req, done in reqs:
        assert done.wait(5)
        assert req.items[0].state == ItemState.DONE
        # the fake engine's "prob" is the mean of the item's own input: rows were not mixed up
        assert req.items[0].outputs["prob"][0] == pytest.approx(req.instance.values[0], abs=1e-6)
    assert all(b.shape == (4, 1, 8, 8) for b in engine.batches)  # the engine always sees [B, ...]
    assert sum(engine.real_rows()) == 6
    assert engine.real_rows()[-1] < 4  # the last batch was padded...
    last = engine.batches[-1].reshape(4, -1)
    assert not last[engine.real_rows()[-1] :].any()  # ...with explicit zero rows


def test_multiframe_request_gathers_all_frames(fake_manifest, stop_list):
    batcher, _ = make_batcher(fake_manifest)
    stop_list.append(batcher)
    req, done = submit(batcher, [0.2, 0.4, 0.6, 0.8, 0.9], StubPipeline())
    assert done.wait(5)
    got = [it.outputs["prob"][0] for it in req.items]
    assert got == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.9], abs=1e-6)


def test_interactive_goes_before_batch(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, max_wait_s=0.2)
    stop_list.append(batcher)
    gate = threading.Event()
    pipe = StubPipeline()
    hold = FakeEngineHold(engine, gate)
    first, _ = submit(batcher, [0.01] * 4, pipe)  # occupies the engine (held)
    assert hold.entered.wait(5)
    low = [submit(batcher, [0.3], pipe, Priority.BATCH) for _ in range(4)]
    time.sleep(0.05)
    high = [submit(batcher, [0.7], pipe, Priority.INTERACTIVE) for _ in range(4)]
    time.sleep(0.1)  # all preprocessed and READY before the engine frees up
    gate.set()
    for _, d in low + high:
        assert d.wait(5)
    second = engine.batches[1].reshape(4, -1).mean(axis=1)
    assert second == pytest.approx([0.7] * 4)


class FakeEngineHold:
    """Blocks the fake engine's first recorded batch until the gate opens."""

    def __init__(self, engine: FakeEngine, gate: threading.Event) -> None:
        self.entered = threading.Event()
        original = engine._run

        def run(batch):
            if len(engine.batches) == 0:
                self.entered.set()
                gate.wait(5)
            return original(batch)

        engine._run = run


def test_cancelled_item_is_never_computed_and_frees_its_slot(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, max_wait_s=0.2)
    stop_list.append(batcher)
    pipe = StubPipeline()
    req, done = submit(batcher, [0.5], pipe)
    time.sleep(0.02)  # READY, waiting for partners
    batcher.cancel(req, Unavailable("client cancelled", reason="CANCELLED"))
    assert done.wait(1)
    assert req.items[0].state == ItemState.CANCELLED
    assert batcher.statistics().depth == 0
    time.sleep(0.3)
    assert engine.batches == []


def test_cancel_while_preprocessing_frees_slot_after_worker(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest)
    stop_list.append(batcher)
    pipe = StubPipeline()
    pipe.gate = threading.Event()
    req, done = submit(batcher, [0.5], pipe)
    time.sleep(0.05)
    batcher.cancel(req, Unavailable("client cancelled", reason="CANCELLED"))
    assert done.wait(1)
    assert batcher.statistics().depth == 1  # the worker still owns the slot
    pipe.gate.set()
    deadline = time.monotonic() + 2
    while batcher.statistics().depth and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher.statistics().depth == 0
    time.sleep(0.05)
    assert engine.batches == []


def test_expired_item_dropped_before_compute(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, max_wait_s=0.5)
    stop_list.append(batcher)
    pipe = StubPipeline()
    # admitted (the estimate is tiny) but the deadline passes while it waits for partners
    batcher.batch_s_estimate = 0.001
    req, done = submit(batcher, [0.5], pipe, deadline=time.monotonic() + 0.05)
    assert done.wait(2)
    assert req.items[0].state in (ItemState.EXPIRED, ItemState.DONE)
    if req.items[0].state == ItemState.DONE:  # launched early to meet the deadline: also correct
        assert req.items[0].t_launch <= req.deadline
    else:
        assert engine.batches == []
    assert batcher.statistics().depth == 0


def test_full_inbox_rejects_at_once_and_counts(fake_manifest, stop_list):
    gate = threading.Event()
    batcher, engine = make_batcher(fake_manifest, queue_capacity=8)
    stop_list.append(batcher)
    FakeEngineHold(engine, gate)
    pipe = StubPipeline()
    submit(batcher, [0.1] * 4, pipe)
    time.sleep(0.05)  # running (held): slots of a running batch are free again
    submit(batcher, [0.1] * 8, pipe)
    t0 = time.monotonic()
    with pytest.raises(Overloaded, match="inbox full"):
        submit(batcher, [0.1], pipe)
    assert time.monotonic() - t0 < 0.5
    assert batcher.statistics().rejected == 1
    with pytest.raises(LimitExceeded, match="batcher.queue_capacity"):
        submit(batcher, [0.1] * 9, pipe)
    gate.set()


def test_deadline_that_cannot_be_met_is_refused(fake_manifest, stop_list):
    batcher, _ = make_batcher(fake_manifest)
    stop_list.append(batcher)
    batcher.batch_s_estimate = 1.0
    with pytest.raises(Overloaded) as e:
        submit(batcher, [0.1], StubPipeline(), deadline=time.monotonic() + 0.2)
    assert e.value.reason == "DEADLINE_UNMEETABLE"


def test_preprocess_failure_fails_only_that_frame(fake_manifest, stop_list):
    batcher, _ = make_batcher(fake_manifest)
    stop_list.append(batcher)
    req, done = submit(batcher, [0.1, 0.2, 0.3], StubPipeline(fail_frames={1}))
    assert done.wait(5)
    states = [i.state for i in req.items]
    assert states == [ItemState.DONE, ItemState.FAILED, ItemState.DONE]
    assert "Pixel Data" in str(req.error)


def test_engine_error_fails_batch_and_keeps_serving(fake_manifest, stop_list):
    batcher, _ = make_batcher(fake_manifest, engine_opts={"fail_batches": {0}})
    stop_list.append(batcher)
    pipe = StubPipeline()
    bad, d1 = submit(batcher, [0.1] * 4, pipe)
    assert d1.wait(5)
    assert isinstance(bad.error, EngineError)
    good, d2 = submit(batcher, [0.2] * 4, pipe)
    assert d2.wait(5)
    assert good.error is None


def test_dead_engine_refuses_new_work(fake_manifest, stop_list):
    dead = threading.Event()
    engine = FakeEngine(fake_manifest, fake_manifest.artifact(), {"dead_after": 0})
    batcher = Batcher(engine, BatcherConfig(max_wait_s=0.0, queue_capacity=8), on_engine_dead=lambda e: dead.set())
    stop_list.append(batcher)
    start_batcher(batcher).wait(5)
    req, done = submit(batcher, [0.1], StubPipeline())
    assert done.wait(5) and dead.wait(5)
    assert isinstance(req.error, EngineDeadError)
    with pytest.raises(Unavailable):
        submit(batcher, [0.1], StubPipeline())


def test_sequential_mode_computes_the_same(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, overlap=False)
    stop_list.append(batcher)
    req, done = submit(batcher, [0.25, 0.75], StubPipeline())
    assert done.wait(5)
    assert [i.outputs["prob"][0] for i in req.items] == pytest.approx([0.25, 0.75])


def test_overlap_prepares_next_batch_while_engine_runs(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, engine_opts={"latency_s": 0.1}, max_wait_s=0.0)
    stop_list.append(batcher)
    pipe = StubPipeline(delay_s=0.01)
    runs: list[tuple[float, float]] = []
    original = engine._run

    def timed(batch):
        t0 = time.monotonic()
        out = original(batch)
        runs.append((t0, time.monotonic()))
        return out

    engine._run = timed
    reqs = [submit(batcher, [0.1] * 4, pipe) for _ in range(3)]
    for _, d in reqs:
        assert d.wait(5)
    first_run = runs[0]
    overlapped = [c for c in pipe.calls if c[0] >= first_run[0] and c[1] <= first_run[1]]
    assert overlapped, "no preprocessing happened while the first batch was running"


def test_pacer_gaps_follow_duty():
    clock = ManualClock()
    pacer = Pacer(clock)
    assert pacer.delay(0.1) == 0.0
    pacer.set_duty(0.5)
    pacer.consume(0.1)  # tokens start empty, one 0.1 s batch ran
    assert pacer.delay(0.1) == pytest.approx(0.2 / 0.5, rel=1e-6)  # 0.2 s of tokens missing at rate 0.5
    clock.advance(0.4)
    assert pacer.delay(0.1) == pytest.approx(0.0, abs=1e-9)
    assert pacer.gap(0.1) == pytest.approx(0.1)  # b(1-u)/u
    pacer.set_duty(0.0)
    assert pacer.delay(0.1) == float("inf")


def test_pacer_busy_fraction():
    clock = ManualClock()
    pacer = Pacer(clock)
    clock.advance(1.0)
    pacer.consume(0.25)
    assert pacer.take_busy_fraction() == pytest.approx(0.25)
    clock.advance(1.0)
    assert pacer.take_busy_fraction() == 0.0


def test_throttled_batcher_fills_batches(fake_manifest, stop_list):
    batcher, engine = make_batcher(fake_manifest, engine_opts={"latency_s": 0.02}, max_wait_s=0.0)
    stop_list.append(batcher)
    batcher.pacer.set_duty(0.25)
    pipe = StubPipeline()
    reqs = []
    for _ in range(12):
        reqs.append(submit(batcher, [0.3], pipe))
        time.sleep(0.01)
    for _, d in reqs:
        assert d.wait(10)
    rows = engine.real_rows()
    # unthrottled with max_wait 0 this trickle would launch ~1 item per batch
    assert np.mean(rows) >= 2.0, rows


def test_dead_engine_answers_frames_still_in_preprocessing(fake_manifest, stop_list):
    engine = FakeEngine(fake_manifest, fake_manifest.artifact(), {"dead_after": 0})
    batcher = Batcher(engine, BatcherConfig(max_wait_s=0.0, queue_capacity=8))
    stop_list.append(batcher)
    start_batcher(batcher).wait(5)
    fast, slow_pipe = StubPipeline(), StubPipeline(delay_s=0.3)
    a, da = submit(batcher, [0.1], fast)
    b, db = submit(batcher, [0.2], slow_pipe)  # still preprocessing when the engine dies
    assert da.wait(5) and db.wait(5), "a request admitted before the engine died was never answered"
    assert isinstance(a.error, EngineDeadError)
    assert isinstance(b.error, Unavailable) and b.error.reason == "ENGINE_DEAD"
    time.sleep(0.4)
    assert batcher.statistics().depth == 0


def test_unexpected_engine_thread_failure_is_fatal_and_answers_everyone(fake_manifest, stop_list):
    from appliance.batching.batcher import BatchObserver

    class Exploding(BatchObserver):
        def on_batch(self, real, size, engine_s):
            raise RuntimeError("observer bug")

    engine = FakeEngine(fake_manifest, fake_manifest.artifact(), {})
    dead = threading.Event()
    batcher = Batcher(
        engine,
        BatcherConfig(max_wait_s=0.0, queue_capacity=8),
        observer=Exploding(),
        on_engine_dead=lambda e: dead.set(),
    )
    stop_list.append(batcher)
    start_batcher(batcher).wait(5)
    req, done = submit(batcher, [0.1], StubPipeline())
    assert dead.wait(5)
    assert done.wait(5)
    with pytest.raises(Unavailable):
        submit(batcher, [0.1], StubPipeline())


def test_interactive_is_preprocessed_before_earlier_batch_frames(fake_manifest, stop_list):
    batcher, _ = make_batcher(fake_manifest, queue_capacity=16)
    stop_list.append(batcher)
    pipe = StubPipeline(delay_s=0.02)
    pipe.gate = threading.Event()
    order: list[float] = []
    original = pipe.run

    def run(inst, frame, out):
        order.append(inst.values[frame])
        return original(inst, frame, out)

    pipe.run = run
    series, d1 = submit(batcher, [0.3] * 12, pipe, Priority.BATCH)
    time.sleep(0.05)  # the feeder holds the first BATCH frame at the gate
    click, d2 = submit(batcher, [0.9], pipe, Priority.INTERACTIVE)
    pipe.gate.set()
    assert d1.wait(10) and d2.wait(10)
    assert order.index(0.9) <= 1, order  # right after the frame that was already in the worker


def test_expired_frame_is_deadline_exceeded(fake_manifest, stop_list):
    from appliance.errors import DeadlineExceeded

    gate = threading.Event()
    batcher, engine = make_batcher(fake_manifest, max_wait_s=0.0)
    stop_list.append(batcher)
    hold = FakeEngineHold(engine, gate)
    submit(batcher, [0.1] * 4, StubPipeline())
    assert hold.entered.wait(5)
    batcher.batch_s_estimate = 0.001
    late, done = submit(batcher, [0.2], StubPipeline(), deadline=time.monotonic() + 0.1)
    time.sleep(0.2)
    gate.set()
    assert done.wait(5)
    assert isinstance(late.error, DeadlineExceeded)


def test_fail_pending_answers_queued_work(fake_manifest, stop_list):
    batcher, _ = make_batcher(fake_manifest, max_wait_s=10.0)
    stop_list.append(batcher)
    batcher.pacer.set_duty(0.0)  # thermal stop: nothing launches
    req, done = submit(batcher, [0.1], StubPipeline())
    time.sleep(0.05)
    assert batcher.fail_pending(Unavailable("thermal stopped", reason="THERMAL_PAUSE")) == 1
    assert done.wait(2) and req.error.reason == "THERMAL_PAUSE"
    assert batcher.statistics().depth == 0


def test_admitted_frame_no_worker_started_expires_and_frees_its_slot(fake_manifest, stop_list):
    """A frame admitted but never picked up by a worker (all busy) is answered at its deadline, slot freed."""
    from appliance.errors import DeadlineExceeded

    engine = FakeEngine(fake_manifest, fake_manifest.artifact(), {})
    batcher = Batcher(engine, BatcherConfig(max_wait_s=0.0, queue_capacity=8))
    stop_list.append(batcher)
    batcher.start(warmup_runs=1).wait(5)  # no feeder: nothing ever preprocesses
    batcher.batch_s_estimate = 0.001
    done = threading.Event()
    req = Request("late", "stub", Priority.BATCH, time.monotonic() + 0.1, time.monotonic(), n_frames=2,
                  on_done=lambda r: done.set())
    batcher.reserve(req)
    assert batcher.statistics().depth == 2
    assert done.wait(2)
    assert isinstance(req.error, DeadlineExceeded)
    assert [i.state for i in req.items] == [ItemState.EXPIRED, ItemState.EXPIRED]
    assert batcher.statistics().depth == 0
    assert not batcher.begin_frame(req.items[0])  # a worker arriving late does not write a freed slot


def test_engine_with_two_batches_in_flight_gets_the_next_before_the_last_result(fake_manifest, stop_list):
    """For an engine that overlaps copy and compute (TensorRT: max_in_flight 2), batch k+1 is submitted before
    batch k's result is collected; rows still come back to their own frames."""
    import collections

    class Pipelined(FakeEngine):
        max_in_flight = 2

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.log: list[str] = []
            self._queue = collections.deque()

        def submit(self, batch):
            ticket = object()
            self._queue.append((ticket, batch.copy()))
            self.log.append("submit")
            return ticket

        def result(self, ticket):
            t, batch = self._queue.popleft()
            assert t is ticket  # oldest first
            self.log.append("result")
            return self.run(batch)

    engine = Pipelined(fake_manifest, fake_manifest.artifact(), {})
    batcher = Batcher(engine, BatcherConfig(max_wait_s=0.05, queue_capacity=16))
    stop_list.append(batcher)
    gate = threading.Event()
    pipe = StubPipeline()
    pipe.gate = gate
    start_batcher(batcher).wait(5)
    reqs = [submit(batcher, [0.05 * (i + 1)], pipe) for i in range(12)]
    gate.set()
    for req, done in reqs:
        assert done.wait(5)
        assert req.items[0].outputs["prob"][0] == pytest.approx(req.instance.values[0], abs=1e-6)
    assert engine.log.count("submit") == engine.log.count("result") == len(engine.batches)
    assert "submit" in engine.log[engine.log.index("submit") + 1 : engine.log.index("result")], engine.log
