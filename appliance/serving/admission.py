"""Who gets in: the shared bounds a request must fit under before its payload goes to a worker.

:class:`ByteBudget` is ``server.inflight_bytes``; the request path also bounds the requests waiting for a worker
(``batcher.queue_capacity``). :class:`Senders` counts each sender's requests in flight, so that a sender that
already has one gets only :data:`SENDER_SHARE` of either bound (docs/robustness.md, "One sender cannot starve the
others"). Event-loop only: no locks beyond the budget's asyncio condition.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Iterator

from appliance.errors import Overloaded

__all__ = ["SENDER_SHARE", "ByteBudget", "Senders"]

#: NOTE (sender share): a sender that already has a file in flight is refused (or, on a stream, waits) at this
#: fraction of the shared bounds -- requests waiting for a worker and inbox slots (``batcher.queue_capacity``),
#: payload bytes in flight (``server.inflight_bytes``); the rest is kept for senders with nothing in flight, so
#: one client's flood cannot shut every other client out.
SENDER_SHARE = 0.75


class Senders:
    """Requests in flight per sender (the gRPC peer; "" = unknown, never limited by share)."""

    def __init__(self) -> None:
        self._in_flight: collections.Counter[str] = collections.Counter()

    def share(self, source: str, *, counted: bool = False) -> float:
        """The fraction of a shared bound a request of ``source`` may fill.

        :data:`SENDER_SHARE` while the sender has another request in flight (``counted``: this request is already
        counted), else all of it.
        """
        others = self._in_flight[source] - (1 if counted else 0)
        return SENDER_SHARE if source and others > 0 else 1.0

    @contextlib.contextmanager
    def count(self, source: str) -> Iterator[None]:
        """Count one request of ``source`` in flight for the duration."""
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
