"""The order in which queued jobs reach a preprocessing worker: by priority, then the senders take turns.

NOTE (fairness): within a priority class, jobs are kept per *source* (the gRPC peer: one client connection) and
the sources take turns, one job each, oldest first within a source. A client that sends forty slow or hostile files
at once therefore delays another client's one file by at most one job per worker, not by all forty
(docs/robustness.md, "One sender cannot starve the others"). With a single source this is plain FIFO.

Not thread-safe: the pool calls every method under its lock. ``len()`` is a plain int read, so the launch
policy may read it without the lock.
"""

from __future__ import annotations

import collections
from typing import Generic, Protocol, TypeVar

from appliance.batching.work import Priority

__all__ = ["JobQueue", "Queued"]


class Queued(Protocol):
    """What the queue reads of a job."""

    @property
    def source(self) -> str:
        """Who sent it (the gRPC peer); jobs with the same source keep their order."""
        ...

    @property
    def priority(self) -> Priority:
        """Its request's scheduling class; lower goes first."""
        ...


J = TypeVar("J", bound=Queued)


class JobQueue(Generic[J]):
    """Jobs waiting for a worker: INTERACTIVE before BATCH; within a class, one job per source in turn."""

    def __init__(self) -> None:
        # per class, the sources in turn order (a dict keeps insertion order), each with its jobs oldest first
        self._classes: dict[Priority, dict[str, collections.deque[J]]] = {p: {} for p in sorted(Priority)}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, job: J) -> None:
        """Queue ``job`` behind its source's earlier jobs; a new source takes its turn after the others."""
        self._classes[job.priority].setdefault(job.source, collections.deque()).append(job)
        self._count += 1

    def pop(self) -> J | None:
        """Take the next job (None when empty); its source goes to the back of the turn order."""
        for sources in self._classes.values():
            if sources:
                source = next(iter(sources))
                jobs = sources.pop(source)
                job = jobs.popleft()
                if jobs:
                    sources[source] = jobs  # re-inserted: now last in turn
                self._count -= 1
                return job
        return None

    def remove(self, job: J) -> bool:
        """Drop ``job`` if it is queued; True if it was."""
        sources = self._classes[job.priority]
        jobs = sources.get(job.source, collections.deque())
        try:
            jobs.remove(job)
        except ValueError:
            return False
        if not jobs:
            del sources[job.source]
        self._count -= 1
        return True

    def drain(self) -> list[J]:
        """Take every queued job, in the order :meth:`pop` would have."""
        out = []
        while (job := self.pop()) is not None:
            out.append(job)
        return out
