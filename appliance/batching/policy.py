"""The launch policy: a pure function from the ready frames and the clock to "launch these now" or "wait".

NOTE (launch rule): launch when B frames are ready, or when the oldest ready frame has waited ``max_wait`` --
or, while more frames are known to be coming (admitted and decoding, or being parsed), up to the time their
preprocessing needs to fill the batch (:func:`coming_wait`: at least one batch time, at most 0.25 s; until it is
full when the decoders have work behind it and frames keep becoming ready, :func:`backlog_stall`), since a padded
row costs the same engine time as a real one. When enough frames are coming to fill the batch, that wait counts
only the engine's idle time (from ``idle_since``): frames that became ready while the engine was busy have not made
it wait, and on a saturated box an idle engine leaves its core to the decoders that are finishing the batch. When
nothing is coming and fewer than :data:`FEW_ARRIVALS` partners are to be expected within ``max_wait``
(:class:`PartnerOdds`: the arrival rate measured while frames waited alone; a lone closed-loop client, whose next
request follows this one's answer, or an idle box), a partial batch launches at once: waiting would only add latency.
INTERACTIVE frames are taken before BATCH frames, oldest first within a class. Under a thermal duty u < 1 the
pacer leaves gaps of about b(1-u)/u between batches, and the wait for partners grows by that gap (a padded slot
burns the same power as a real one) -- but never past the point where the earliest deadline could still be met.
While the pacer holds the engine back, nothing launches.

No clock, no lock, no I/O: the batcher calls :func:`choose` under its lock, and tests drive it with numbers.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BATCH_AGING_S", "BURST_LOAD", "COMING_WAIT_MAX_S", "FEW_ARRIVALS", "STALL_FRAMES", "Decision",
           "PartnerOdds", "Ready", "backlog_stall", "choose", "coming_wait", "may_burst"]

#: Partners to expect within ``max_wait`` below which a partial batch with nothing coming does not wait.
FEW_ARRIVALS = 0.1
#: The longest a partial batch waits for frames on their way, s (:func:`coming_wait`, :func:`backlog_stall`).
COMING_WAIT_MAX_S = 0.25
#: Frame times (the preprocessing estimate per core) without a frame becoming ready after which a batch that waits
#: to be full launches what it has (:func:`backlog_stall`).
STALL_FRAMES = 4.0
#: Seconds a decoded frame may wait for the engine before its class no longer matters, only its age: INTERACTIVE frames
#: still go first, but a BATCH frame is not passed over for ever (it also holds an inbox slot while it waits).
BATCH_AGING_S = 1.0
#: A batch may take the idle cores (burst threads) when the preprocessing is expected to keep its cores busy for
#: less than this share of the batch's time.
BURST_LOAD = 0.5


class Ready(Protocol):
    """What the policy reads of a ready frame."""

    @property
    def priority(self) -> int:
        """Scheduling class; lower goes first."""
        ...

    @property
    def t_ready(self) -> float | None:
        """Monotonic time the frame became ready (None: now)."""
        ...

    @property
    def deadline(self) -> float | None:
        """Monotonic deadline of its request, or None."""
        ...


@dataclass(frozen=True)
class Decision:
    """Launch ``launch`` (indices into the ``ready`` sequence, in launch order) now, or wait ``wait_s``."""

    launch: tuple[int, ...] | None
    wait_s: float


def choose(
    ready: Sequence[Ready],
    now: float,
    *,
    batch_size: int,
    batch_s: float,
    pace_delay_s: float,
    pace_gap_s: float,
    max_wait_s: float,
    stopping: bool = False,
    coming: int = 0,
    coming_wait_s: float = 0.0,
    arrival_rate: float = math.inf,
    idle_since: float = -math.inf,
    partner_odds: float | None = None,
    stall_s: float | None = None,
    last_ready: float = -math.inf,
) -> Decision:
    """Decide the next launch.

    Args:
        ready: frames whose slots hold model input.
        now: the current monotonic time.
        batch_size: B.
        batch_s: the engine's current estimate of seconds per batch.
        pace_delay_s: how long the pacer holds the next batch back (0 = may launch now, inf = paused).
        pace_gap_s: the pacer's steady-state gap between batches at the current duty.
        max_wait_s: how long the oldest ready frame may wait for partners when unthrottled.
        stopping: draining: launch whatever is ready.
        coming: frames known to be on their way (admitted and being preprocessed, or requests being parsed).
        coming_wait_s: how long a partial batch may wait for them (:func:`coming_wait` with overlap, so the
            engine does not spend whole batches on padding; unbounded in sequential mode, where decoding and
            inference never overlap). Never past a deadline.
        arrival_rate: frames admitted per second lately (inf: unknown, so always allow ``max_wait``).
        idle_since: when the engine last became idle (``now`` while a batch is in flight).
        partner_odds: partners to expect within ``max_wait_s`` of a frame left alone (:meth:`PartnerOdds.expected`:
            the arrivals seen while frames waited alone, once they are evidence enough); None: from ``arrival_rate``.
        stall_s: with a backlog behind the coming frames (:func:`backlog_stall`), wait for a full batch until this
            long passes without a frame becoming ready (at most :data:`COMING_WAIT_MAX_S`); None: do not.
        last_ready: when a frame last became ready.
    """
    if not ready:
        return Decision(None, 0.1)
    if pace_delay_s > 0:
        return Decision(None, min(pace_delay_s, 0.1))
    t_ready = [now if r.t_ready is None else r.t_ready for r in ready]
    # a frame ready for BATCH_AGING_S goes by its age alone: a flood of INTERACTIVE frames starved BATCH (session 18)
    order = sorted(range(len(ready)), key=lambda i: (
        0 if now - t_ready[i] >= BATCH_AGING_S else ready[i].priority, t_ready[i]))
    if len(order) >= batch_size:
        return Decision(tuple(order[:batch_size]), 0.0)
    since = min(t_ready)  # the wait is counted from the oldest ready frame...
    max_wait = max_wait_s + min(pace_gap_s, 1.0)  # under a budget, prefer full batches
    odds = arrival_rate * max_wait_s if partner_odds is None else partner_odds
    if coming == 0 and pace_gap_s == 0.0 and odds < FEW_ARRIVALS:
        max_wait = 0.0  # no partner is on its way or likely to arrive: waiting only adds latency
    if coming > 0:
        max_wait = max(max_wait, coming_wait_s)
        if len(ready) + coming >= batch_size:
            since = max(since, idle_since)  # ...or, with a full batch on its way, from when the engine went idle
            if stall_s is not None:  # until full, while frames keep becoming ready
                max_wait = max(max_wait, min(COMING_WAIT_MAX_S, max(last_ready - since, 0.0) + stall_s))
    deadlines = [r.deadline for r in ready if r.deadline is not None]
    if deadlines:  # never hold a frame past the point where its batch could still finish in time
        max_wait = min(max_wait, max(0.0, min(deadlines) - batch_s - since))
    waited = now - since
    if waited >= max_wait - 1e-9 or stopping:  # 1 ns of slack: float time must not wait forever for 1e-17 s
        return Decision(tuple(order), 0.0)
    return Decision(None, min(max_wait - waited, 0.1) if coming > 0 else max_wait - waited)


class PartnerOdds:
    """How many partners to expect within ``window_s`` for a ready frame that has none on its way.

    Measured, not inferred from the arrival rate alone: the rate of arrivals *while a frame waits alone*, times the
    window. A lone closed-loop client sends its next request only after this one is answered, so no partner ever
    comes however fast it sends (at 45 requests/s the arrival rate expected 0.2 within 5 ms, and each of its
    requests waited the 5 ms for nothing: docs/performance.md, "Session 23"); open-loop arrivals come at their
    own rate whatever the daemon is doing, and measure as that rate. A request arrives when it reaches the daemon
    (queued for a worker to parse, from when the launch rule counts it as coming; or admitted directly, a tensor).

    Each frame left alone is watched from then until the first arrival, the end of the launch rule's wait
    (``since + window_s``) or its answer, whichever comes first, whether the batch waited or not, so the decision
    does not bias its own evidence: an engine that answers within the window would otherwise count the lone
    client's next request as a partner, while an open-loop rate is the same over any part of the window. Arrivals
    and time watched are summed with a decay of :data:`MEMORY_S` in time. The measurement overrides the arrival
    rate only once the time watched should, at that rate, have seen :data:`EVIDENCE` arrivals: a quiet box, a
    slow lone client or a sparse Poisson stream keep going by the rate, as before. Pure: the caller holds its lock
    and passes the time.
    """

    #: arrivals the watched time must be worth, at the current arrival rate, before the measurement counts: a lone
    #: client at r requests/s is watched up to ``window_s`` a frame, so its time watched settles near r * MEMORY_S *
    #: window_s, worth r**2 * 2 s * 5 ms arrivals: 4 at 20/s, where the arrival rate first makes a partner likely
    #: (5 left 20-25/s waiting for nothing, session 24)
    EVIDENCE = 4.0
    #: time constant of the sums' decay, s
    MEMORY_S = 2.0

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._open: collections.deque[tuple[float, float]] = collections.deque()  # (watched from, until), oldest first
        self._last_since = -math.inf
        self._arrivals = 0.0  # decayed sums over the watched frames
        self._watched_s = 0.0
        self._t = -math.inf  # when the sums were last decayed

    @property
    def rate(self) -> float | None:
        """Arrivals per second while frames waited alone, as of the last call (None: nothing watched)."""
        return self._arrivals / self._watched_s if self._watched_s > 0.0 else None

    def expected(self, arrival_rate: float) -> float:
        """Partners to expect within ``window_s``: measured once it is evidence enough, else ``arrival_rate``'s."""
        measured = self.rate
        if measured is None or arrival_rate * self._watched_s < self.EVIDENCE:
            return arrival_rate * self.window_s
        return measured * self.window_s

    def alone(self, since: float, now: float) -> None:
        """At ``now`` a partial batch whose oldest frame became ready at ``since`` has nothing on its way.

        Watched once per ``since``, and only while the launch rule's wait from ``since`` is still open (a batch
        that already waited that long for frames that were coming launches anyway).
        """
        if since > self._last_since and now - since < self.window_s:
            self._last_since = since
            self._open.append((now, since + self.window_s))

    def arrived(self, now: float) -> None:
        """A request arrived at ``now``: the partner of every frame still watched."""
        self._age(now)
        while self._open:
            start, end = self._open.popleft()
            self._record(now <= end, min(now, end) - start)

    def answered(self, launched: float, now: float) -> None:
        """A batch launched at ``launched`` was answered at ``now``: its frames are watched no longer."""
        self._age(now)
        while self._open and self._open[0][0] <= launched:
            start, end = self._open.popleft()
            self._record(False, min(now, end) - start)

    def expire(self, now: float) -> None:
        """Frames whose wait ended before ``now`` with no arrival: watched in full, no partner. Ages the sums."""
        self._age(now)
        while self._open and now > self._open[0][1]:
            start, end = self._open.popleft()
            self._record(False, end - start)

    def _age(self, now: float) -> None:
        if now > self._t:
            keep = math.exp(-(now - self._t) / self.MEMORY_S) if math.isfinite(self._t) else 0.0
            self._arrivals *= keep
            self._watched_s *= keep
            self._t = now

    def _record(self, arrived: bool, watched_s: float) -> None:
        self._arrivals += float(arrived)
        self._watched_s += max(watched_s, 0.0)


def coming_wait(*, batch_s: float, batch_size: int, ready: int, coming: int, preprocess_s: float,
                cores: int) -> float:
    """How long a partial batch of ``ready`` frames may wait for the ``coming`` ones (``coming_wait_s``).

    About the time the preprocessing needs to fill it: the missing frames that are on their way, at
    ``preprocess_s`` each on the ``cores`` it has; never less than one batch time, never more than
    :data:`COMING_WAIT_MAX_S`. One batch time alone was too short a wait where the engine is fast beside the
    decoders (15 ms a batch of 8 against 4-22 ms a slice): at 16 clients batches carried 5.5 real rows of 8, and
    the padding cost a third of the engine's CPU (docs/performance.md, "Session 22").
    """
    fill_s = max(min(batch_size - ready, coming), 0) * max(preprocess_s, 0.0) / max(cores, 1)
    return min(max(batch_s, fill_s), COMING_WAIT_MAX_S)


def backlog_stall(*, batch_size: int, ready: int, coming: int, preprocess_s: float, cores: int) -> float | None:
    """How long a partial batch that waits to be full may go without a frame becoming ready (``stall_s``).

    None when it does not wait to be full: only when the frames coming exceed the batch's missing ones by at least
    the preprocessing's ``cores`` do the decoders stay busy after it fills, so that an idle engine costs no
    throughput while a padded row costs a real one's engine time. The fill estimate is a mean, and a JPEG 2000 slice
    takes three times it: at 16 clients batches launched with 6.1 real rows of 8 while 9.8 frames were on their way
    (docs/performance.md, "Session 24"). The wait lasts while frames keep becoming ready: :data:`STALL_FRAMES`
    frame times without one (a hung decoder, files stuck in parsing, a replaced worker), and it launches.
    """
    missing = batch_size - ready
    if missing <= 0 or coming < missing + max(cores, 1) or preprocess_s <= 0.0:
        return None
    return STALL_FRAMES * preprocess_s / max(cores, 1)


def may_burst(*, sequential: bool, preprocessing_idle: bool, arrival_rate: float, batch_s: float,
              backlog: int = 0, batch_size: int = 1, coming: int = 0, preprocess_s: float = 0.0,
              cores: int = 1) -> bool:
    """Whether the next batch may run on the engine's burst threads (all cores) instead of its own.

    NOTE (burst rule): when the preprocessing will leave a core idle for most of the batch. In sequential mode
    nothing decodes during a batch. Otherwise either the preprocessing expected during the batch (the ``coming``
    frames admitted and not yet ready or still being parsed, plus ``arrival_rate * batch_s`` new ones that a
    worker will decode, at ``preprocess_s`` each, on the ``cores`` the engine's own threads leave) keeps those
    cores busy for less than :data:`BURST_LOAD` of ``batch_s``, or no worker is busy now and the engine is the
    bottleneck: a whole further batch (``backlog``: decoded frames beyond this one) already waits for it. The
    burst threads run below the workers' priority, so a worker that wakes mid-batch takes its core back; the
    batch then waits for the chunk the preempted thread held, which is why a decode-heavy load keeps its single
    engine thread. A lone closed-loop client bursts unless a frame takes it longer than a batch. Measured
    (docs/performance.md "Burst threads", session 7): uncompressed slices at 16 clients +7 % throughput;
    the JPEG 2000 mix unchanged.
    """
    if sequential:
        return True
    if preprocessing_idle and backlog >= batch_size:
        return True
    load_s = (coming + arrival_rate * batch_s) * preprocess_s / max(cores, 1)
    return load_s < BURST_LOAD * batch_s
