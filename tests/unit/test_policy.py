"""The launch policy as a table: pure numbers in, a decision out (no threads, no clock, no sleeps)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import pytest

from appliance.batching.policy import (
    COMING_WAIT_MAX_S,
    FEW_ARRIVALS,
    Decision,
    PartnerOdds,
    backlog_stall,
    choose,
    coming_wait,
    may_burst,
)

INTERACTIVE, BATCH = 0, 1


@dataclass(frozen=True)
class F:
    priority: int
    t_ready: float
    deadline: float | None = None


BASE = {"batch_size": 4, "batch_s": 0.05, "pace_delay_s": 0.0, "pace_gap_s": 0.0, "max_wait_s": 0.005}

CASES = [
    # (id, ready frames, now, overrides, expected decision)
    ("nothing ready", [], 1.0, {}, Decision(None, 0.1)),
    ("full batch at once", [F(BATCH, 0.9 + i / 100) for i in range(5)], 1.0, {}, Decision((0, 1, 2, 3), 0.0)),
    ("interactive first", [F(BATCH, 0.1), F(BATCH, 0.2), F(INTERACTIVE, 0.9), F(BATCH, 0.3), F(INTERACTIVE, 0.95)],
     1.0, {}, Decision((2, 4, 0, 1), 0.0)),
    ("lone frame waits for partners", [F(BATCH, 0.999)], 1.0, {}, Decision(None, 0.004)),
    ("lone frame goes after max_wait", [F(BATCH, 0.99)], 1.0, {}, Decision((0,), 0.0)),
    ("paced: nothing launches", [F(BATCH, 0.0)] * 4, 1.0, {"pace_delay_s": 0.3}, Decision(None, 0.1)),
    ("paused: nothing launches", [F(BATCH, 0.0)] * 4, 1.0, {"pace_delay_s": math.inf}, Decision(None, 0.1)),
    ("throttled: wait up to the gap for a full batch", [F(BATCH, 0.9)], 1.0, {"pace_gap_s": 0.2},
     Decision(None, 0.105)),
    ("throttled wait capped at 1 s", [F(BATCH, 0.0)], 0.5, {"pace_gap_s": 30.0}, Decision(None, 0.505)),
    ("deadline caps the wait", [F(BATCH, 0.9, deadline=1.04)], 1.0, {"pace_gap_s": 0.2}, Decision((0,), 0.0)),
    ("deadline leaves some wait", [F(BATCH, 0.9, deadline=1.1)], 1.0, {"pace_gap_s": 0.2},
     Decision(None, 0.05)),
    ("draining launches what is ready", [F(BATCH, 0.999)], 1.0, {"stopping": True}, Decision((0,), 0.0)),
    ("sequential: waits for frames still decoding", [F(BATCH, 0.5)], 1.0,
     {"coming": 2, "coming_wait_s": math.inf}, Decision(None, 0.1)),
    ("sequential: but not past a deadline", [F(BATCH, 0.5, deadline=1.0)], 1.0,
     {"coming": 2, "coming_wait_s": math.inf}, Decision((0,), 0.0)),
    ("frames coming: wait up to one batch time", [F(BATCH, 0.99)], 1.0, {"coming": 3, "coming_wait_s": 0.05},
     Decision(None, 0.04)),
    ("frames coming but waited long enough", [F(BATCH, 0.9)], 1.0, {"coming": 3, "coming_wait_s": 0.05},
     Decision((0,), 0.0)),
    ("nothing coming: max_wait only", [F(BATCH, 0.99)], 1.0, {"coming": 0, "coming_wait_s": 0.05},
     Decision((0,), 0.0)),
    ("nothing coming, arrivals rare: no wait", [F(BATCH, 0.999)], 1.0, {"arrival_rate": 16.0},
     Decision((0,), 0.0)),
    ("nothing coming, arrivals frequent: max_wait", [F(BATCH, 0.999)], 1.0, {"arrival_rate": 40.0},
     Decision(None, 0.004)),
    ("frames coming: wait even if arrivals rare", [F(BATCH, 0.99)], 1.0,
     {"coming": 1, "coming_wait_s": 0.05, "arrival_rate": 1.0}, Decision(None, 0.04)),
    ("a full batch coming: only the engine's idle time counts", [F(BATCH, 0.9)] * 2, 1.0,
     {"coming": 2, "coming_wait_s": 0.05, "idle_since": 0.99}, Decision(None, 0.04)),
    ("a full batch coming, idle long enough", [F(BATCH, 0.9)] * 2, 1.0,
     {"coming": 2, "coming_wait_s": 0.05, "idle_since": 0.94}, Decision((0, 1), 0.0)),
    ("a partial batch coming: the oldest frame's age counts", [F(BATCH, 0.9)] * 2, 1.0,
     {"coming": 1, "coming_wait_s": 0.05, "idle_since": 0.99}, Decision((0, 1), 0.0)),
    ("a full batch coming, but a deadline", [F(BATCH, 0.9, deadline=1.03)] * 2, 1.0,
     {"coming": 2, "coming_wait_s": 0.05, "idle_since": 0.99}, Decision((0, 1), 0.0)),
    ("nothing coming, arrivals frequent, but no partner came lately: no wait", [F(BATCH, 0.999)], 1.0,
     {"arrival_rate": 40.0, "partner_odds": 0.0}, Decision((0,), 0.0)),
    ("nothing coming, arrivals rare, but partners came: max_wait", [F(BATCH, 0.999)], 1.0,
     {"arrival_rate": 1.0, "partner_odds": 0.3}, Decision(None, 0.004)),
    ("no partner came lately, but frames coming: wait for them", [F(BATCH, 0.99)], 1.0,
     {"coming": 1, "coming_wait_s": 0.05, "arrival_rate": 40.0, "partner_odds": 0.0}, Decision(None, 0.04)),
    ("throttled: wait for partners even if arrivals rare", [F(BATCH, 0.9)], 1.0,
     {"pace_gap_s": 0.2, "arrival_rate": 1.0}, Decision(None, 0.105)),
]


@pytest.mark.parametrize(("ready", "now", "overrides", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_policy_table(ready, now, overrides, expected) -> None:
    got = choose(ready, now, **{**BASE, **overrides})
    assert got.launch == expected.launch
    assert got.wait_s == pytest.approx(expected.wait_s, abs=1e-9)


def test_never_more_than_b_and_never_an_empty_launch() -> None:
    import random

    rng = random.Random(1)
    for _ in range(2000):
        n = rng.randrange(0, 12)
        ready = [F(rng.choice((INTERACTIVE, BATCH)), rng.uniform(0, 1), rng.choice((None, rng.uniform(0.5, 2))))
                 for _ in range(n)]
        d = choose(ready, 1.0, batch_size=4, batch_s=rng.uniform(0.001, 0.2), pace_delay_s=rng.choice((0.0, 0.1)),
                   pace_gap_s=rng.uniform(0, 2), max_wait_s=rng.uniform(0, 0.05))
        if d.launch is not None:
            assert 1 <= len(d.launch) <= 4 and len(set(d.launch)) == len(d.launch)
            chosen = [ready[i] for i in d.launch]
            skipped = [r for i, r in enumerate(ready) if i not in d.launch]
            for r in skipped:  # nothing skipped ranks before anything chosen
                assert all((c.priority, c.t_ready) <= (r.priority, r.t_ready) for c in chosen)
        else:
            assert d.wait_s > 0


def test_partner_odds_go_by_the_rate_until_the_time_watched_is_evidence_enough() -> None:
    odds = PartnerOdds(0.005)
    t = 10.0
    for _ in range(8):
        odds.alone(t, t)
        odds.alone(t, t + 0.001)  # the same frame seen again: watched once
        odds.arrived(t + 0.002)  # a partner 2 ms later: one arrival in 2 ms watched
        t += 0.03
    assert odds.rate == pytest.approx(1 / 0.002)
    assert odds.expected(100.0) == pytest.approx(0.5)  # 16 ms watched is worth 1.6 arrivals at 100/s: the rate's
    for _ in range(60):  # a lone client at 33/s: nobody within the 5 ms, one later is too late
        odds.alone(t, t)
        odds.expire(t + 0.0051)
        odds.arrived(t + 0.03)
        t += 0.03
    assert odds.expected(33.0) < FEW_ARRIVALS  # 0.3 s watched, worth 10 arrivals at 33/s: the measurement's
    assert odds.expected(2.0) == pytest.approx(0.01)  # ...but not at 2/s
    odds.alone(t - 0.006, t)  # left alone after its wait had ended (it waited for frames that were coming)
    odds.arrived(t)
    t += 600.0  # a quiet night: what was watched is forgotten
    odds.expire(t)
    assert odds.expected(40.0) == pytest.approx(0.2)


def test_partner_odds_of_open_loop_arrivals_are_their_rate_times_the_wait() -> None:
    """Poisson arrivals at 105/s come whatever the daemon does: about 0.5 partners in 5 ms, measured or not, and
    never so few that the partner wait is dropped."""
    rng = random.Random(3)
    odds = PartnerOdds(0.005)
    t, seen, rates = 0.0, [], []
    for _ in range(4000):
        ready = t + rng.uniform(0.0, 0.01)  # a frame left alone, if no request arrives first...
        since = ready - rng.uniform(0.0, 0.005)  # ...ready a while before (the engine was busy)
        t += rng.expovariate(105.0)  # the next arrival
        if ready < t:
            odds.expire(ready)
            odds.alone(since, ready)
        odds.expire(t)
        odds.arrived(t)
        seen.append(odds.expected(105.0))
        rates.append(odds.rate)
    assert statistics.median(r for r in rates[200:] if r is not None) == pytest.approx(105.0, rel=0.15)
    assert min(seen[200:]) > FEW_ARRIVALS


def test_partner_odds_follow_a_change_of_load_within_a_fraction_of_a_second() -> None:
    odds = PartnerOdds(0.005)
    t = 0.0
    for _ in range(200):  # a lone closed-loop client at 50/s: its next request follows the answer, 20 ms later
        odds.alone(t, t)
        t += 0.02
        odds.expire(t)
        odds.arrived(t)
    assert odds.expected(50.0) == 0.0
    followed = 0
    while odds.expected(100.0) < FEW_ARRIVALS:  # a second client now sends 2 ms after the first one's frame is ready
        odds.alone(t, t)
        odds.arrived(t + 0.002)
        t += 0.02
        followed += 1
    assert followed <= 12  # the wait comes back within a quarter of a second


@pytest.mark.parametrize(("sequential", "idle", "rate", "backlog", "coming", "pre_ms", "expected"), [
    (False, True, 10.0, 0, 0, 25.0, True),  # a lone client: 0.4 frames x 25 ms in a 40 ms batch, one worker
    (False, True, 30.0, 0, 0, 25.0, False),  # Poisson at 30/s: 1.2 frames x 25 ms = 30 ms, most of the batch
    (False, False, 30.0, 0, 0, 1.5, True),  # ... of uncompressed slices: 1.8 ms of 40, though a worker is busy now
    (False, False, 0.0, 8, 8, 1.5, True),  # a closed loop's other 8 requests, uncompressed: 12 ms of 40
    (False, False, 0.0, 0, 8, 8.5, False),  # ... on the JPEG 2000 mix: 68 ms, the workers fill the batch
    (False, True, 30.0, 7, 0, 25.0, False),  # the next batch is not full yet: the engine is not the bottleneck
    (False, True, 200.0, 8, 0, 25.0, True),  # a full batch already waits for this one: the engine is the bottleneck
    (False, False, 200.0, 16, 0, 25.0, False),  # ... but a worker is decoding now and more keep coming
    (False, False, 0.0, 0, 0, 0.0, True),  # nothing to preprocess (or no estimate yet)
    (True, False, 100.0, 0, 8, 25.0, True),  # sequential: nothing decodes while the engine runs
])
def test_burst_only_when_the_workers_leave_a_core_idle_for_most_of_the_batch(sequential, idle, rate, backlog,
                                                                            coming, pre_ms, expected) -> None:
    assert may_burst(sequential=sequential, preprocessing_idle=idle, arrival_rate=rate, batch_s=0.04,
                     backlog=backlog, batch_size=8, coming=coming, preprocess_s=pre_ms / 1000.0) is expected


def test_the_expected_decoding_is_spread_over_the_cores_the_engine_leaves() -> None:
    # 8 frames x 4 ms = 32 ms: one core is busy for 80 % of a 40 ms batch, each of two for 40 %
    args = {"sequential": False, "preprocessing_idle": False, "arrival_rate": 0.0, "batch_s": 0.04, "coming": 8,
            "preprocess_s": 0.004}
    assert may_burst(**args, cores=1) is False
    assert may_burst(**args, cores=2) is True


@pytest.mark.parametrize(("batch_s", "ready", "coming", "pre_ms", "cores", "expected_ms"), [
    (15.0, 5, 3, 7.4, 1, 22.2),  # session 22's box: 3 frames at 7.4 ms on one core fill it after 22 ms, not 15
    (15.0, 5, 3, 7.4, 2, 15.0),  # the same on two cores: 11.1 ms, so one batch time
    (35.0, 5, 3, 7.4, 1, 35.0),  # a slow engine: one batch time, as before session 22
    (15.0, 5, 1, 7.4, 1, 15.0),  # only one frame coming: 7.4 ms of it, and at least one batch time
    (15.0, 1, 40, 22.0, 1, 154.0),  # 7 missing of 40 coming, each a JPEG 2000 slice
    (15.0, 0, 100, 50.0, 1, 250.0),  # never more than COMING_WAIT_MAX_S
    (15.0, 8, 4, 7.4, 1, 15.0),  # nothing missing
    (15.0, 5, 3, 0.0, 1, 15.0),  # no estimate yet
])
def test_a_partial_batch_waits_as_long_as_its_frames_take_to_arrive(batch_s, ready, coming, pre_ms, cores,
                                                                     expected_ms) -> None:
    got = coming_wait(batch_s=batch_s / 1e3, batch_size=8, ready=ready, coming=coming, preprocess_s=pre_ms / 1e3,
                      cores=cores)
    assert got == pytest.approx(expected_ms / 1e3)
    assert COMING_WAIT_MAX_S == 0.25


@pytest.mark.parametrize(("ready", "coming", "cores", "pre_ms", "expected_ms"), [
    (5, 4, 1, 7.4, 29.6),  # one frame behind the 3 missing keeps the one core busy: 4 frame times without progress
    (5, 4, 2, 7.4, None),  # ...but not two cores
    (5, 3, 1, 7.4, None),  # exactly the missing frames: the fill estimate alone (coming_wait)
    (1, 40, 1, 22.0, 88.0),
    (8, 4, 1, 7.4, None),  # nothing missing
    (5, 4, 1, 0.0, None),  # no estimate yet
])
def test_a_batch_waits_to_be_full_only_with_a_backlog_behind_its_coming_frames(ready, coming, cores, pre_ms,
                                                                              expected_ms) -> None:
    got = backlog_stall(batch_size=8, ready=ready, coming=coming, preprocess_s=pre_ms / 1e3, cores=cores)
    assert got == (None if expected_ms is None else pytest.approx(expected_ms / 1e3))


def test_a_batch_waiting_to_be_full_launches_once_frames_stop_becoming_ready() -> None:
    args = {"batch_size": 4, "batch_s": 0.01, "pace_delay_s": 0.0, "pace_gap_s": 0.0, "max_wait_s": 0.005,
            "coming": 6, "coming_wait_s": 0.02, "idle_since": 0.9, "stall_s": 0.03}
    ready = [F(BATCH, 0.85), F(BATCH, 0.95)]
    assert choose(ready, 1.0, **args, last_ready=0.99) == Decision(None, pytest.approx(0.02))  # until 0.99 + 0.03
    assert choose(ready, 1.0, **args, last_ready=0.95).launch == (0, 1)  # 50 ms since the last: stalled
    assert choose(ready, 1.0, **{**args, "stall_s": None}, last_ready=0.99).launch == (0, 1)  # the fill estimate only
    # frames keep becoming ready: it waits on, up to COMING_WAIT_MAX_S from when the engine went idle (0.9)
    assert choose(ready, 1.14, **args, last_ready=1.13) == Decision(None, pytest.approx(0.01))
    assert choose(ready, 1.151, **args, last_ready=1.15).launch == (0, 1)
