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
good reading as before. A minority stream of glitches is rejected one reading at a time, whichever came first. A
stream that is right half the time or less has no majority and is not believed at all (the governor holds, then
goes BLIND). Ramps up to ``tolerance_c`` / 2 per sample stay self-consistent; the steepest sensor ramp on the
simulated plants is 4 °C per 1 s sample.
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
        """Add ``value`` read at ``now_s``; True when it agrees with a strict majority of the window and another."""
        while self._recent and now_s - self._recent[0][0] > self.max_age_s:
            self._recent.popleft()
        self._recent.append((now_s, value))
        votes = sum(1 for _, v in self._recent if abs(v - value) <= self.tolerance_c)
        return votes >= 2 and 2 * votes > len(self._recent)
