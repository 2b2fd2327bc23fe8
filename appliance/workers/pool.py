"""Supervised preprocessing worker processes: the job queue, and one supervisor thread per worker, in the daemon.

A :class:`Job` is one request's trip through a worker: parse + validate (the worker keeps the parsed instance),
admission (slots reserved by the daemon, see :mod:`appliance.serving.analyze`), then one round trip per frame: "decode
frame i into slot s" -> frame info. The supervisor thread drives that conversation with a time budget on every
step. A worker that dies (segfault, abort, OOM kill), runs past its budget, or stops answering is killed and
replaced (:mod:`appliance.workers.processes`); the item it held gets a clear error and nothing else is affected.
Restarts are counted.

NOTE (ordering): queued jobs are taken INTERACTIVE first; within a class the senders take turns, oldest first
within a sender (:mod:`appliance.workers.jobqueue`). A job whose request was cancelled or whose deadline passed is
answered without being started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.batching.work import Priority, Request, WorkItem
from appliance.clock import Clock, RealClock
from appliance.config import WorkersConfig
from appliance.errors import ApplianceError, DeadlineExceeded, DicomError, Unavailable
from appliance.workers.arena import InputBuffer
from appliance.workers.channel import Channel
from appliance.workers.child import WorkerSpec, decode_error
from appliance.workers.jobqueue import JobQueue
from appliance.workers.processes import WorkerProcesses, _kill, _scrub, _WorkerLost, exit_text

__all__ = ["Job", "PoolStats", "WorkerPool"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool."""

    workers: int  # live worker processes
    queued: int  # jobs waiting for a worker
    busy: int  # jobs on a worker now
    restarts: int  # workers replaced (crash, budget, memory, recycle)
    last_progress: float  # monotonic time of the last message from any worker (or idle)


@dataclass(eq=False)
class Job:
    """One request's trip through a worker (built by the request path)."""

    request: Request
    data: bytes | None  # the DICOM file; dropped once sent to the worker
    pipeline: str
    # Called on the supervisor thread after a successful parse with (n_frames, sop_instance_uid); reserves the
    # request's slots and returns its items, or raises an ApplianceError (queue full, ...).
    admit: Callable[[int, str], list[WorkItem]]
    # Called once if the job fails before admission (parse error, crash, cancelled, expired, stopping).
    fail: Callable[[ApplianceError], None]
    source: str = ""  # who sent it (the gRPC peer): senders take turns for the workers
    id: int = field(default_factory=itertools.count(1).__next__)
    cancelled: bool = False

    @property
    def priority(self) -> Priority:
        """Its request's scheduling class."""
        return self.request.priority


class WorkerPool(WorkerProcesses):
    """The supervised worker processes. ``start()``, ``submit()`` jobs, ``stop()``."""

    def __init__(
        self,
        spec: WorkerSpec,
        config: WorkersConfig,
        *,
        workers: int,
        batcher: Any,  # appliance.batching.batcher.Batcher: frame_ready / frame_failed / begin_frame
        clock: Clock | None = None,
        on_restart: Callable[[str], None] | None = None,
        stage_lock: threading.Lock | None = None,  # sequential mode: held while a file is parsed or a frame decoded
        cores: int = 1,  # the cores the daemon may use
    ) -> None:
        super().__init__(spec, config, workers=workers, clock=clock or RealClock(), on_restart=on_restart)
        self.batcher = batcher
        self.stage_lock = stage_lock
        self._queue: JobQueue[Job] = JobQueue()
        self._threads: list[threading.Thread] = []
        self._busy: set[Job] = set()
        self._stepping = [False] * workers  # worker i is parsing or decoding right now (its supervisor writes it)
        self.cores = max(1, cores)
        self.decoder_threads = min(config.decoder_threads or self.cores, self.cores)
        # Cores the engine computes on right now (0 while it is idle or runs on a GPU); the daemon wires it up
        self.engine_cores: Callable[[], int] = lambda: 0

    # ---- daemon side ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the supervisor threads; each starts its worker process. Returns at once."""
        if self.config.input_buffer_bytes > 0:
            self._inputs = [InputBuffer(self.config.input_buffer_bytes) for _ in range(self.workers)]
            self.spec = dataclasses.replace(self.spec, input_bytes=self.config.input_buffer_bytes)
        for i in range(self.workers):
            thread = threading.Thread(target=self._supervise, args=(i,), name=f"worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, job: Job) -> None:
        """Queue a job (INTERACTIVE before BATCH)."""
        with self._cond:
            if self._stopping:
                raise Unavailable("service is draining", reason="DRAINING")
            self._queue.push(job)
            self._cond.notify()
        self.batcher.note_arrival()  # a partner for a frame the launch rule may be holding (policy.PartnerOdds)

    def cancel(self, job: Job) -> None:
        """Drop a job: a queued one is never started; a running one stops after its current step."""
        with self._cond:
            job.cancelled = True
            self._queue.remove(job)

    def unadmitted(self) -> int:
        """Jobs queued or being parsed (approximate, lock-free: the launch policy reads it often)."""
        return len(self._queue) + sum(1 for j in list(self._busy) if not j.request.items)

    def ahead(self, priority: Priority, source: str) -> int:
        """At least how many jobs a new job of ``priority`` from ``source`` would wait behind for a worker.

        Those queued before it (:meth:`JobQueue.ahead`) and those being parsed now (approximate, lock-free).
        """
        parsing = sum(1 for j in list(self._busy) if not j.request.items)
        return parsing + self._queue.ahead(priority, source)

    def idle(self) -> bool:
        """True when no worker is parsing or decoding and no job waits for one.

        Lock-free: the engine thread asks before every batch. A job's bookkeeping after its last frame (the
        ``drop`` message) does not count as work.
        """
        return not any(self._stepping) and not len(self._queue)

    def spare_cores(self, index: int) -> int:
        """Threads worker ``index`` may decode its next frame on: 1, or the cores nothing else uses now.

        NOTE (decoder threads): more than one only while no other worker is parsing or decoding, no job waits for
        one and the engine leaves the cores free (in sequential mode nothing else runs while a frame decodes).
        Lock-free, read before every frame; work that starts mid-frame shares the cores (the workers run at a
        lower priority than the engine). Measured in docs/performance.md, "Decoder threads".
        """
        if self.decoder_threads <= 1:
            return 1
        if self.stage_lock is not None:
            return self.decoder_threads
        if len(self._queue):
            return 1
        busy = sum(1 for i, stepping in enumerate(self._stepping) if stepping and i != index) + self.engine_cores()
        return max(1, min(self.decoder_threads, self.cores - busy))

    def statistics(self) -> PoolStats:
        """Return a snapshot."""
        with self._cond:
            return PoolStats(
                workers=sum(1 for p in self._procs.values() if p.is_alive()),
                queued=len(self._queue),
                busy=len(self._busy),
                restarts=self.restarts,
                last_progress=self.last_progress,
            )

    def fail_queued(self, error: ApplianceError) -> int:
        """Answer every queued (not started) job with ``error``; return how many."""
        with self._cond:
            jobs = self._queue.drain()
        for job in jobs:
            job.fail(error)
        return len(jobs)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop accepting, answer queued jobs, ask workers to exit, kill those that don't within the timeout."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.fail_queued(Unavailable("service is shutting down", reason="DRAINING"))
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            procs = list(self._procs.values())
        for proc in procs:
            _kill(proc)
        if not any(thread.is_alive() for thread in self._threads):  # else the mappings go with the process
            for buffer in self._inputs:
                buffer.close()

    # ---- supervisor threads ---------------------------------------------------------------------------------

    def _next_job(self) -> Job | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                while (job := self._queue.pop()) is not None:
                    if self._runnable(job):
                        self._busy.add(job)
                        return job
                self.last_progress = self.clock.monotonic()  # idle counts as progress
                self._cond.wait(timeout=0.5)

    def _runnable(self, job: Job) -> bool:
        """False (and the job answered) when it was cancelled or expired while queued. Called under the lock."""
        deadline = job.request.deadline
        if job.cancelled:
            return False
        if deadline is not None and self.clock.monotonic() > deadline:
            threading.Thread(target=job.fail, args=(DeadlineExceeded("deadline passed while queued for a "
                             "preprocessing worker"),), daemon=True).start()
            return False
        return True

    def _supervise(self, index: int) -> None:
        proc: multiprocessing.process.BaseProcess | None = None
        conn: Channel | None = None
        while not self._stopping:
            if proc is not None and conn is not None and conn.dead():
                self._retire(index, proc, "crashed", f"exited while idle ({exit_text(proc.exitcode)})")
                proc = conn = None
            if proc is None or conn is None:
                try:
                    proc, conn = self._spawn(index)
                except _WorkerLost as lost:
                    log.error("preprocessing worker %d failed to start: %s; retrying", index, lost)
                    time.sleep(1.0)
                    continue
            job = self._next_job()
            if job is None:
                break
            try:
                if conn.dead():  # died while this thread waited for a job (OOM killer, a signal): not the job's fault
                    self._retire(index, proc, "crashed", f"exited while idle ({exit_text(proc.exitcode)})")
                    proc, conn = self._respawn_for(index, job)
                rss = self._run(conn, job)
                if rss > self.config.recycle_rss_bytes:
                    self._retire(index, proc, "recycle", f"RSS {rss} bytes over workers.recycle_rss_bytes")
                    proc = conn = None
            except _WorkerLost:
                proc = conn = None  # already killed and counted; a new one is started above
            except Exception as e:  # noqa: BLE001 - a bug here must not kill supervision: fail the job, renew
                log.exception("preprocessing supervisor %d failed on a job", index)
                job.fail(Unavailable(f"internal error in preprocessing: {type(e).__name__}", reason="INTERNAL"))
                for item in job.request.items:
                    self.batcher.frame_failed(item, Unavailable("internal error in preprocessing"))
                if proc is not None:
                    self._retire(index, proc, "crashed", f"supervisor error {type(e).__name__}")
                proc = conn = None
            finally:
                with self._cond:
                    self._busy.discard(job)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        if proc is not None:
            proc.join(0.5)
            _kill(proc)

    def _budget(self, request: Request) -> float:
        budget = self.config.step_timeout_s
        if request.deadline is not None:  # never work on past the client's deadline (plus a little slack)
            budget = min(budget, max(0.05, request.deadline - self.clock.monotonic() + 0.25))
        return budget

    def _run(self, conn: Channel | None, job: Job) -> int:
        """Run one job on one worker; return the worker's RSS after it. Raises _WorkerLost."""
        assert conn is not None
        index, worker = self._proc_for()
        data, job.data = job.data, None
        lock = self.stage_lock if self.stage_lock is not None else contextlib.nullcontext()
        data = data or b""
        size = len(data)
        # through the worker's input buffer (no copies through the kernel), or the pipe for a larger file
        inbox = self._inputs[index].bytes if self._inputs and size <= self._inputs[index].bytes.size else None
        with lock, self._step(index):  # sequential mode: parsing is preprocessing too
            try:
                if inbox is not None:
                    inbox[:size] = np.frombuffer(data, np.uint8)
                    conn.send(("parse", job.id, job.pipeline, size))
                else:
                    conn.send(("parse", job.id, job.pipeline, -1))
                    conn.send_bytes(data)
            except OSError:
                self._retire(index, worker, "crashed", "pipe broken")
                _scrub(inbox, size)
                job.fail(DicomError("decoder failed: the preprocessing worker died", field="dicom.PixelData"))
                raise _WorkerLost("crashed", Unavailable("worker pipe broken")) from None
            del data
            try:
                msg = self._recv(conn, worker, self._budget(job.request), index)
            except _WorkerLost as lost:  # killed before it answered: it may not have copied the file out
                _scrub(inbox, size)
                job.fail(lost.error)
                raise
        if msg[0] == "error":
            job.fail(decode_error(msg[2]))
            return int(msg[3])
        _, _, n_frames, sop_uid, rss, parse_ms = msg
        if job.cancelled:
            job.fail(Unavailable("client cancelled", reason="CANCELLED"))
            self._send(conn, worker, index, ("drop", job.id))
            return int(rss)
        try:
            items = job.admit(n_frames, sop_uid)
        except ApplianceError as e:
            job.fail(e)
            self._send(conn, worker, index, ("drop", job.id))
            return int(rss)
        forgotten = False  # the worker forgets the instance with its answer to the last frame
        for i, item in enumerate(items):
            last = i == len(items) - 1
            try:
                after = self._frame(conn, worker, index, job, item, parse_ms if i == 0 else 0.0, last)
            except _WorkerLost as lost:
                self.batcher.frame_failed(item, lost.error)
                rest = Unavailable("not decoded: the worker was replaced on an earlier frame", reason="DECODER_LOST")
                for other in items[i + 1 :]:
                    self.batcher.frame_failed(other, rest)
                raise
            if after is not None:
                rss, forgotten = after, last
        if not forgotten:  # no frames, or the last one was skipped (cancelled or expired meanwhile)
            self._send(conn, worker, index, ("drop", job.id))
        return int(rss)

    def _send(self, conn: Channel, worker: multiprocessing.process.BaseProcess, index: int,
              msg: tuple[Any, ...]) -> None:
        try:
            conn.send(msg)
        except OSError:
            self._retire(index, worker, "crashed", "pipe broken")
            raise _WorkerLost("crashed", DicomError("decoder failed: the preprocessing worker died",
                                                    field="dicom.PixelData")) from None

    def _frame(self, conn: Channel, worker: multiprocessing.process.BaseProcess, index: int, job: Job,
               item: WorkItem, parse_ms: float, last: bool) -> int | None:
        """Decode one frame; return the worker's RSS after it, or None if it was skipped (not sent)."""
        if not self.batcher.begin_frame(item):  # cancelled or expired meanwhile
            return None
        lock = self.stage_lock if self.stage_lock is not None else contextlib.nullcontext()
        with lock, self._step(index):
            self._send(conn, worker, index, ("frame", job.id, item.frame_index, item.slot, last,
                                             self.spare_cores(index)))
            msg = self._recv(conn, worker, self._budget(job.request), index)
        if msg[0] == "error":
            self.batcher.frame_failed(item, decode_error(msg[2]))
            return int(msg[3])
        _, _, info, ms, rss = msg
        self.batcher.frame_ready(item, info, ms, parse_ms)
        return int(rss)

    @contextlib.contextmanager
    def _step(self, index: int) -> Iterator[None]:
        """Mark worker ``index`` as parsing or decoding (read by :meth:`idle`) for the duration of one step."""
        self._stepping[index] = True
        try:
            yield
        finally:
            self._stepping[index] = False

