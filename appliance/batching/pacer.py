"""The thermal pacer: a token bucket of engine-busy seconds that turns a duty u in [0, 1] into launch gaps."""

from __future__ import annotations

import math
import threading

from appliance.clock import Clock

__all__ = ["Pacer"]


class Pacer:
    """Turns a thermal duty u in [0, 1] into gaps between launches: a token bucket of engine-busy seconds.

    The bucket refills at rate u and holds about one batch. A batch that takes b seconds may launch once the
    bucket holds b, and is charged when it launches (:meth:`launch`), so the bucket refills while it runs; for u < 1
    that leaves gaps of about b(1-u)/u and a busy fraction of u. Thread-safe. It also accounts the busy fraction
    the engine achieved, which the governor uses for anti-windup.

    Until session 18 a batch was charged only when it ended (:meth:`consume`): the bucket stood full while the batch
    ran and the refill of those b seconds was lost, so every gap was b/u and the engine was busy u/(1+u) of the
    time (0.33 at a duty of 0.5), which the governor's anti-windup then read as work that was not there
    (docs/thermal.md, "The pacer").
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._duty = 1.0
        self._tokens = 0.0
        self._capacity = 0.0
        self._last = clock.monotonic()
        self._busy_s = 0.0
        self._busy_mark = self._last

    @property
    def duty(self) -> float:
        """The current duty."""
        return self._duty

    def set_duty(self, duty: float) -> None:
        """Set the duty (clamped to [0, 1])."""
        with self._lock:
            self._refill(self._clock.monotonic())
            self._duty = min(1.0, max(0.0, float(duty)))

    def _refill(self, now: float) -> None:
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._duty)
        self._last = now

    def delay(self, cost_s: float) -> float:
        """Return seconds to wait before a batch of ``cost_s`` may launch (0 = now, inf = paused)."""
        with self._lock:
            if self._duty >= 1.0:
                return 0.0
            if self._duty <= 0.0:
                return math.inf
            now = self._clock.monotonic()
            self._capacity = max(self._capacity, cost_s)
            self._refill(now)
            missing = cost_s - self._tokens
            return 0.0 if missing <= 1e-9 else missing / self._duty

    def gap(self, cost_s: float) -> float:
        """Return the steady-state gap b(1-u)/u between batches of ``cost_s`` at the current duty."""
        u = self._duty
        if u >= 1.0:
            return 0.0
        return math.inf if u <= 0.0 else cost_s * (1.0 - u) / u

    def launch(self, cost_s: float) -> float:
        """Charge a batch expected to take ``cost_s`` as it launches; return the charge to give :meth:`consume`.

        At a duty of 1 nothing is paced and nothing is charged (0.0).
        """
        with self._lock:
            if self._duty >= 1.0:
                return 0.0
            now = self._clock.monotonic()
            self._capacity = max(self._capacity, cost_s)
            self._refill(now)
            self._tokens -= cost_s
            return cost_s

    def consume(self, busy_s: float, charged_s: float = 0.0) -> None:
        """Account one batch that kept the engine busy for ``busy_s``; ``charged_s`` is what :meth:`launch` took."""
        with self._lock:
            now = self._clock.monotonic()
            self._capacity = max(self._capacity, busy_s)
            self._refill(now)
            self._tokens += charged_s - busy_s
            self._busy_s += busy_s

    def take_busy_fraction(self) -> float:
        """Return the fraction of time since the last call the engine was busy, and restart the window."""
        with self._lock:
            now = self._clock.monotonic()
            span = now - self._busy_mark
            frac = self._busy_s / span if span > 0 else 0.0
            self._busy_s = 0.0
            self._busy_mark = now
            return min(1.0, frac)
