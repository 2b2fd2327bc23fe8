"""The time boundary: a small Clock protocol, the real clock, and a manual clock for tests."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "RealClock"]


class Clock(Protocol):
    """Monotonic time in seconds and a way to wait."""

    def monotonic(self) -> float:
        """Return monotonic seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...


class RealClock:
    """The process's monotonic clock."""

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` (no-op when <= 0)."""
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock whose time moves only when told to (``advance``), or when someone sleeps on it.

    ``sleep(s)`` advances the clock by ``s`` at once, so code that paces itself runs instantly and
    deterministically under test.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        """Return the current manual time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0)."""
        if seconds < 0:
            raise ValueError("time cannot go backwards")
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` instead of blocking."""
        if seconds > 0:
            self.advance(seconds)
