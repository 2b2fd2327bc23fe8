"""Which readings to believe when some are glitches: a majority vote over the last few (docs/thermal.md, point 8).

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
trust (the hotter one may be the glitch, which costs throughput, never the limit). Ramps up to ``tolerance_c`` / 2
per sample stay self-consistent; the steepest sensor ramp on the simulated plants is 4 °C per 1 s sample.
"""

from __future__ import annotations

from collections import deque

__all__ = ["ReadingVote"]


class ReadingVote:
    """The last ``size`` plausible readings (none older than ``max_age_s``) and a majority test for a new one."""

    def __init__(self, tolerance_c: float, size: int, max_age_s: float) -> None:
        self.tolerance_c = tolerance_c
        self.max_age_s = max_age_s
        self._recent: deque[tuple[float, float]] = deque(maxlen=max(size, 1))

    @property
    def alone(self) -> bool:
        """True when the last reading had no other recent one to agree with (after start, or a long gap)."""
        return len(self._recent) == 1

    def believed(self, now_s: float, value: float) -> bool:
        """Add ``value`` read at ``now_s``; True when it agrees with a strict majority of the window and another.

        And no interleaved hotter group disputes it (:meth:`_disputed_by_hotter`).
        """
        while self._recent and now_s - self._recent[0][0] > self.max_age_s:
            self._recent.popleft()
        self._recent.append((now_s, value))
        votes = sum(1 for _, v in self._recent if abs(v - value) <= self.tolerance_c)
        return votes >= 2 and 2 * votes > len(self._recent) and not self._disputed_by_hotter(value)

    def _disputed_by_hotter(self, value: float) -> bool:
        """Two or more recent readings hotter by more than half the tolerance, interleaved with this reading's own.

        Two streams that far apart cannot both be the die, and trusting the cooler one is the unsafe guess: a
        stream of glitches 11-13 °C low became the reference whenever the die had risen a degree, and a sensor
        alternating between the die and 11 °C below ran the die at 81.6 °C (second held-out review, session 14).
        Interleaved means a reading of this reading's own group is older than the newest hotter one; in a real fall
        the hotter readings are all older than the cooler ones, so a fall is never disputed.
        """
        earlier = [v for _, v in list(self._recent)[:-1]]  # oldest first
        gap = self.tolerance_c / 2.0
        hotter = [i for i, v in enumerate(earlier) if v > value + gap]
        if len(hotter) < 2:
            return False
        return any(abs(v - value) <= gap for v in earlier[: hotter[-1]])
