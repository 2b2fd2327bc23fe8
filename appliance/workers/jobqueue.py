"""The order in which queued jobs reach a preprocessing worker: by priority, then the senders take turns.

NOTE (classes): INTERACTIVE goes first, but not always: while BATCH jobs wait, every ``INTERACTIVE_RUN + 1``-th job
is a BATCH one. Strictly first, a flood of INTERACTIVE work (proto3's default priority) starved BATCH completely: 9
of 10 BATCH requests DEADLINE_EXCEEDED at 10 s, p99 13.4 s over 150 s (held-out review, session 18).

NOTE (fairness): within a priority class, jobs are kept per *source* (``admission.sender_of``: a client certificate
under mutual TLS, else a remote host or one local connection) and the sources take turns, one job each, oldest
first within a source. A client that sends forty slow or hostile files at once therefore delays another client's
one file by at most one job per worker, not by all forty (docs/robustness.md, "One sender cannot starve the
others"). With a single source this is plain FIFO.

Not thread-safe: the pool calls every method under its lock. ``len()`` is a plain int read, so the launch
policy may read it without the lock.
"""

from __future__ import annotations

import collections
from typing import Generic, Protocol, TypeVar

from appliance.batching.work import Priority

__all__ = ["INTERACTIVE_RUN", "JobQueue", "Queued"]

#: Jobs of a higher class taken in a row while a lower class waits; then one of the lower class (a share of 1 in 5).
INTERACTIVE_RUN = 4


class Queued(Protocol):
    """What the queue reads of a job."""

    @property
    def source(self) -> str:
        """Who sent it (``admission.sender_of``); jobs with the same source keep their order."""
        ...

    @property
    def priority(self) -> Priority:
        """Its request's scheduling class; lower goes first."""
        ...


J = TypeVar("J", bound=Queued)


class JobQueue(Generic[J]):
    """Jobs waiting for a worker: INTERACTIVE before BATCH (BATCH keeps a share); within a class, sources take turns."""

    def __init__(self) -> None:
        # per class, the sources in turn order (a dict keeps insertion order), each with its jobs oldest first
        self._classes: dict[Priority, dict[str, collections.deque[J]]] = {p: {} for p in sorted(Priority)}
        self._count = 0
        self._run = 0  # jobs of the first waiting class taken in a row while another class waited

    def __len__(self) -> int:
        return self._count

    def push(self, job: J) -> None:
        """Queue ``job`` behind its source's earlier jobs; a new source takes its turn after the others."""
        self._classes[job.priority].setdefault(job.source, collections.deque()).append(job)
        self._count += 1

    def pop(self) -> J | None:
        """Take the next job (None when empty); its source goes to the back of the turn order.

        The first class that has jobs, unless it has had ``INTERACTIVE_RUN`` turns in a row while another waited:
        then the next class that has jobs gets one.
        """
        waiting = [sources for sources in self._classes.values() if sources]
        if not waiting:
            return None
        if len(waiting) > 1 and self._run >= INTERACTIVE_RUN:
            sources, self._run = waiting[1], 0
        else:
            sources = waiting[0]
            self._run = self._run + 1 if len(waiting) > 1 else 0
        source = next(iter(sources))
        jobs = sources.pop(source)
        job = jobs.popleft()
        if jobs:
            sources[source] = jobs  # re-inserted: now last in turn
        self._count -= 1
        return job

    def ahead(self, priority: Priority, source: str) -> int:
        """At least how many queued jobs a new job of ``priority`` from ``source`` would wait behind (a lower bound).

        Within its class its own source's queued jobs go first, and every other source takes at least as many turns
        (one, for a new source); the classes share turns as :meth:`pop` gives them. Jobs queued later may still
        overtake it (a higher class, a source earlier in turn).
        """
        sources = self._classes[priority]
        own = len(sources.get(source, ()))
        mine = own + sum(min(len(jobs), max(own, 1)) for s, jobs in sources.items() if s != source)
        first = min(self._classes)
        others = sum(len(jobs) for p, srcs in self._classes.items() if p != priority for jobs in srcs.values())
        if priority == first:  # a BATCH job gets a turn after INTERACTIVE_RUN in a row (the run so far counts)
            return mine + min(others, (mine + self._run) // INTERACTIVE_RUN)
        return mine + min(others, INTERACTIVE_RUN - self._run + INTERACTIVE_RUN * mine)

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
