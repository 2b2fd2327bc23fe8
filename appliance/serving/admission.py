"""Who gets in: the shared bounds a request must fit under before its payload goes to a worker.

:class:`ByteBudget` is ``server.inflight_bytes``; the request path also bounds the requests waiting for a worker
and the inbox's slots (``batcher.queue_capacity``). :class:`Senders` counts each sender's requests in flight and
when each was last seen, so that while several senders are active one that already has a request in flight gets
only :data:`SENDER_SHARE` of those bounds (docs/robustness.md, "One sender cannot starve the others"). Both are
changed on the event loop only (no locks beyond the budget's asyncio condition); :meth:`Senders.share` is also read
from the worker pool's supervisor threads, which admit parsed files, so it reads a snapshot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Iterator

from appliance.clock import Clock, RealClock
from appliance.errors import Overloaded

__all__ = ["ACTIVE_S", "SENDER_SHARE", "ByteBudget", "Senders"]

#: NOTE (sender share): while another sender is active, a sender that already has a file in flight is refused
#: (or, on a stream, waits) at this fraction of the shared bounds -- requests waiting for a worker and inbox slots
#: (``batcher.queue_capacity``), payload bytes in flight (``server.inflight_bytes``); the rest is kept for senders
#: with nothing in flight, so one client's flood cannot shut every other client out. A client alone has all of
#: them; a client refused because another filled everything is active from then on, and its retry finds room.
SENDER_SHARE = 0.75
#: Seconds a sender counts as active after its last request arrived (or while it has one in flight).
ACTIVE_S = 5.0


class Senders:
    """Requests in flight and last arrival per sender (the gRPC peer; "" = unknown, never limited by share)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or RealClock()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._seen: dict[str, float] = {}  # last arrival, monotonic

    def share(self, source: str, *, counted: bool = False) -> float:
        """The fraction of a shared bound a request of ``source`` may fill.

        :data:`SENDER_SHARE` while the sender has another request in flight (``counted``: this request is already
        counted) and some other sender is active; else all of it.
        """
        others = self._in_flight[source] - (1 if counted else 0)
        if not source or others <= 0:
            return 1.0
        now = self.clock.monotonic()
        # a snapshot: a supervisor thread asks while the event loop may add or forget senders (tuple() is atomic)
        active = any(s != source and (self._in_flight[s] or now - t < ACTIVE_S) for s, t in tuple(self._seen.items()))
        return SENDER_SHARE if active else 1.0

    @contextlib.contextmanager
    def count(self, source: str) -> Iterator[None]:
        """Count one request of ``source`` in flight for the duration (and note its arrival)."""
        now = self.clock.monotonic()
        for s in [s for s, t in self._seen.items() if now - t >= ACTIVE_S and not self._in_flight[s]]:
            del self._seen[s]  # forget senders long gone, so the table stays as small as the active set
        if source:
            self._seen[source] = now
        self._in_flight[source] += 1
        try:
            yield
        finally:
            self._in_flight[source] -= 1
            if not self._in_flight[source]:
                del self._in_flight[source]


class ByteBudget:
    """Bytes of request payload in flight. Taken before a payload goes to a worker, returned on reply."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, n: int, *, wait: bool, share: float = 1.0) -> AsyncIterator[None]:
        """Hold ``n`` bytes; ``share`` < 1: only up to that fraction of the budget (a sender already in flight)."""
        limit = int(self.limit * share)
        async with self._cond:
            if wait:
                await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= limit)
            elif self.used and self.used + n > limit:
                part = "" if share >= 1.0 else (f" (this sender already has requests in flight: {limit} bytes, "
                                                f"{share:.0%} of the budget, the rest kept for other senders)")
                raise Overloaded(
                    f"{self.used} bytes of requests in flight; this one ({n} bytes) would pass the budget "
                    f"server.inflight_bytes = {self.limit}{part}",
                    retry_after_s=0.2,
                    reason="INFLIGHT_BYTES" if self.used + n > self.limit else "SENDER_SHARE",
                )
            self.used += n
        try:
            yield
        finally:
            async with self._cond:
                self.used -= n
                self._cond.notify_all()
