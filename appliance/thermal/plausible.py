"""Which readings to believe when some are glitches, and how low to take a believed one (docs/thermal.md, 8 and 9).

:class:`ReadingVote` is the majority vote (point 8); :class:`FallBound` the envelope a believed reading may not
fall far below (point 9).

The governor rejects a reading that jumped more than ``max_jump_c_per_s`` from the last good one, and believes a
jump only when ``recover_samples`` readings in a row agree on it. Alone, that rule lets one unconfirmed reading
become the reference: a glitch on the first read after start (or a short burst of them) was "the last good
value", later glitches of the same size agreed with it, and every true reading was an implausible jump. With a
glitch every 3 s the true readings never strung five together, and the governor regulated on values 20 °C below
the die: 79.4 °C for the rest of the hour (held-out review, session 14).

So a reading must also agree (within ``tolerance_c``) with a strict majority of the last ``size`` readings in the
plausible range, itself included, and with at least one other. The first reading after start is used for its own
sample but becomes the reference only once another agrees; one alone after a long gap is judged against the last
good reading as before. A minority stream of glitches is rejected one reading at a time, whichever came first.

A majority is not enough when two streams interleave: a sensor alternating between the die and 11 °C below gave
each stream a majority in turn. So a reading is also not believed while an interleaved group of readings more
than half the tolerance hotter disputes it: of two streams that far apart, the cooler one is the unsafe one to
trust (the hotter one may be the glitch, which costs throughput, never the limit). Two hotter readings in the vote's
window dispute it, and so does a hotter group of over a third of the last ``DISPUTE_SPAN`` windows. Ramps up to
``tolerance_c`` / 2 per sample stay self-consistent; the steepest sensor ramp on the simulated plants is 4 °C per 1 s
sample.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

__all__ = ["FallBound", "ReadingVote"]


class ReadingVote:
    """The recent plausible readings, and a majority test for a new one over the last ``size`` of them.

    None of the voters is older than ``max_age_s``; the dispute looks further back (:attr:`DISPUTE_SPAN`).
    """

    #: How many vote windows back a hotter group may dispute a reading. Over one window (5 reads), a glitch, a true
    #: reading and three glitches 12 °C low on a sensor glitching on 30-40 % of reads were a majority beside a single
    #: hotter reading; they became the reference and the true readings were outvoted: 77.3 °C (session 15).
    DISPUTE_SPAN = 2

    def __init__(self, tolerance_c: float, size: int, max_age_s: float) -> None:
        self.tolerance_c = tolerance_c
        self.max_age_s = max_age_s
        self._size = max(size, 1)
        self._seen: deque[tuple[float, float]] = deque(maxlen=self.DISPUTE_SPAN * self._size)

    def _window(self) -> list[float]:
        """The last ``size`` readings no older than ``max_age_s`` before the newest (the vote's window)."""
        if not self._seen:
            return []
        newest = self._seen[-1][0]
        return [v for t, v in list(self._seen)[-self._size:] if newest - t <= self.max_age_s]

    @property
    def alone(self) -> bool:
        """True when the last reading had no other recent one to agree with (after start, or a long gap)."""
        return len(self._window()) == 1

    def believed(self, now_s: float, value: float) -> bool:
        """Add ``value`` read at ``now_s``; True when it agrees with a strict majority of the window and another.

        And no interleaved hotter group disputes it (:meth:`_disputed_by_hotter`).
        """
        while self._seen and now_s - self._seen[0][0] > self.DISPUTE_SPAN * self.max_age_s:
            self._seen.popleft()
        self._seen.append((now_s, value))
        recent = self._window()
        votes = sum(1 for v in recent if abs(v - value) <= self.tolerance_c)
        return votes >= 2 and 2 * votes > len(recent) and not self._disputed_by_hotter(value)

    def _disputed_by_hotter(self, value: float) -> bool:
        """Two or more recent readings hotter by more than half the tolerance, interleaved with this reading's own.

        Two streams that far apart cannot both be the die, and trusting the cooler one is the unsafe guess: a
        stream of glitches 11-13 °C low became the reference whenever the die had risen a degree, and a sensor
        alternating between the die and 11 °C below ran the die at 81.6 °C (second held-out review, session 14).
        Interleaved means a reading of this reading's own group is older than the newest hotter one; in a real fall
        the hotter readings are all older than the cooler ones, so a fall is never disputed.
        """
        seen = [v for _, v in list(self._seen)[:-1]]  # oldest first, over DISPUTE_SPAN vote windows
        # two hotter among the vote's own window (session 14), or over a third of the longer span (session 15: three
        # glitches in a row stood beside a single hotter reading); a spike every 5 s is neither
        return (self._interleaved(value, seen[-(self._size - 1):], lambda n, of: n >= 2)
                or self._interleaved(value, seen, lambda n, of: n >= 2 and 3 * n > of))

    def _interleaved(self, value: float, earlier: list[float], enough: Callable[[int, int], bool]) -> bool:
        gap = self.tolerance_c / 2.0
        hotter = [i for i, v in enumerate(earlier) if v > value + gap]
        if not hotter or not enough(len(hotter), len(earlier)):
            return False
        return any(abs(v - value) <= gap for v in earlier[: hotter[-1]])


class FallBound:
    """How low a believed reading may be taken: the recent readings' envelope, less a margin (docs/thermal.md, 9).

    The die cannot cool much faster than its power and heatsink allow, and the governor models both. So the
    envelope is the highest recent reading carried forward by the models' change since, sinking at ``rate_c_per_s``
    beyond them; a reading more than ``margin_c`` under it is taken as the envelope less ``margin_c``. A reading at
    or above that bound passes unchanged, so sensor noise and every fall the models explain (a load that stops)
    are untouched, and the result never decreases as the reading rises (a colder reading never gets less duty).

    Why: glitches 8 °C low on 30 % of reads pass the jump test and, voted in now and then, pulled the regulated
    mean down: 27 of 33 plants above 75 °C, up to 115 s; three glitches 12 °C low in a row became the jump
    reference, and the true readings were then rejected as jumps (77.9 °C). A reading that froze 6-9 °C low by an
    ordinary step read as a cool die until the stuck check fired: up to 126 s above (held-out reviews, session 14).

    A sensor that has just been caught lying (:meth:`doubt`: a reading rejected as a jump or outvoted) gets the
    smaller ``doubt_margin_c`` for ``DOUBT_PERIODS``: with half the reads 6 °C low, the glitches that were believed
    were taken 2 °C under the die, and a run of them read as a cooling die the PI answered with more duty (16 of 33
    plants above 75 °C, up to 21 s, 76.1 °C; session 16). Either margin leaves the result monotone in the reading.
    """

    #: Control periods after a rejected reading during which the smaller margin applies.
    DOUBT_PERIODS = 60
    #: How many other recent outvoted readings must agree before an outvoted one raises the envelope.
    STREAM = 2

    #: Control periods without a believed reading that count as an outage.
    GAP_PERIODS = 10
    #: How many periods back another reading may confirm a rise of the envelope.
    SUPPORT_PERIODS = 6
    #: How many periods back the two readings that say whether the sensor moves may lie.
    MOVING_PERIODS = 3

    def __init__(self, margin_c: float, rate_c_per_s: float, period_s: float = 1.0, *,
                 doubt_margin_c: float | None = None) -> None:
        self.margin_c = margin_c
        self.doubt_margin_c = margin_c if doubt_margin_c is None else min(doubt_margin_c, margin_c)
        self.rate_c_per_s = rate_c_per_s
        # windows count periods, not seconds: with a 2 s period a 3 s window never held two readings, the sensor
        # always "moved", and a reading that froze low wore the envelope away (session 15 review: 11 of 32 plants
        # above 75 °C at 2 s, 28 at 5 s)
        self.gap_s = self.GAP_PERIODS * period_s
        self.support_s = self.SUPPORT_PERIODS * period_s
        self.moving_s = self.MOVING_PERIODS * period_s
        self.doubt_s = self.DOUBT_PERIODS * period_s
        self._top: tuple[float, float, tuple[float, float]] | None = None  # (time, envelope °C, models then, W)
        self._last: deque[tuple[float, float]] = deque(maxlen=16)  # the readings before, and when
        self._credit = 0.0  # sinking owed since the readings last moved, °C
        self._doubted: float | None = None  # when a reading was last rejected as a glitch
        self._outvoted: list[tuple[float, float]] = []  # the recent readings the vote rejected, and when

    def doubt(self, now_s: float) -> None:
        """A reading read at ``now_s`` was rejected as a glitch: use the smaller margin for a while."""
        self._doubted = now_s

    def margin(self, now_s: float) -> float:
        """How far under the envelope a reading read at ``now_s`` may be taken, °C."""
        doubting = self._doubted is not None and now_s - self._doubted <= self.doubt_s
        return self.doubt_margin_c if doubting else self.margin_c

    def observe(self, now_s: float, reading: float, model_w: tuple[float, float], c_per_w: tuple[float, float]) -> None:
        """Let a reading the vote rejected raise the envelope as a believed one would (it is not regulated on).

        When the glitches are the majority, the true readings are the ones outvoted, and an envelope built from the
        believed glitches alone lifted nothing: 60 % of reads 12 °C low put 3 of 33 plants above 75 °C (session 16).
        Of two streams the hotter is the safe one to trust (point 8), but only a *stream*: the reading counts when
        at least ``STREAM`` other outvoted readings of the last ``SUPPORT_PERIODS`` agree with it within the margin.
        A spike every 5 s is two in that window, and letting them hold the envelope cut a plant to 0.55 of ideal.
        """
        self._outvoted = [(t, v) for t, v in self._outvoted if now_s - t <= self.support_s]
        agree = sum(1 for _, v in self._outvoted if abs(v - reading) <= self.margin_c)
        self._outvoted.append((now_s, reading))
        if agree >= self.STREAM:
            self.bound(now_s, reading, model_w, c_per_w)

    def modelled_change(self, model_w: tuple[float, float], c_per_w: tuple[float, float]) -> float:
        """How far the die and heatsink models moved since the envelope was last updated, °C (0 before any)."""
        if self._top is None:
            return 0.0
        _, _, (die0, sink0) = self._top
        return c_per_w[0] * (model_w[0] - die0) + c_per_w[1] * (model_w[1] - sink0)

    def reset(self) -> None:
        """Forget the envelope: the next reading starts it again (a doubt about the sensor stays)."""
        self._top = None
        self._last.clear()
        self._credit = 0.0

    def bound(self, now_s: float, reading: float, model_w: tuple[float, float], c_per_w: tuple[float, float]) -> float:
        """Return the reading to regulate on (>= ``reading``) and let ``reading`` raise the envelope.

        ``model_w`` is the die and heatsink models now, as low-passed power (W), and ``c_per_w`` turns a change of
        each into °C at the governor's learned full power: the envelope moves with the models' change, and learning
        that figure rescales the change instead of moving the envelope.
        """
        # the envelope rises only as far as the highest other reading of the last SUPPORT_PERIODS: one believed
        # spike must not hold the die low for minutes, glitches between the true readings must not stop a rise, and
        # a die rising faster than the margin per sample still lifts it to the reading before
        recent = [v for t, v in self._last if now_s - t <= self.moving_s][-2:]
        moving = len(recent) < 2 or recent[0] != recent[1]
        support = [v for t, v in self._last if now_s - t <= self.support_s]
        confirmed = min(reading, max(support)) if support else None
        self._last.append((now_s, reading))
        if self._top is None:
            self._top = (now_s, reading, model_w)
            return reading
        t0, env, _ = self._top
        carried = env + self.modelled_change(model_w, c_per_w)
        # The envelope sinks only when the readings move: a reading that stepped down and froze must not wear it
        # down, while a quiet sensor that steps down a degree after a still minute gets the minute's sinking (at
        # most the margin at once). Judged on the readings before this one, so the result stays monotone.
        # An outage (no believed reading for over GAP_PERIODS: read errors, BLIND) sinks it in full: nothing was
        # seen to stand still. A few rejected glitches are no outage.
        dt = max(now_s - t0, 0.0)
        margin = self.margin(now_s)
        self._credit = min(self._credit + self.rate_c_per_s * dt, margin)
        if dt > self.gap_s:
            self._credit += self.rate_c_per_s * dt
        if moving or dt > self.gap_s:
            carried -= self._credit
            self._credit = 0.0
        self._top = (now_s, carried if confirmed is None else max(carried, confirmed), model_w)
        return max(reading, carried - margin)
