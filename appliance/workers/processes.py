"""The worker processes themselves: start one, hear from it within a budget, retire it and count the restart.

:class:`WorkerProcesses` is the half of :class:`~appliance.workers.pool.WorkerPool` that knows about processes and
pipes. The pool adds the job queue and, on each worker's supervisor thread, the conversation about each job
(parse, admission, frames). A worker that dies (segfault, abort, OOM kill), runs past its budget or stops
answering is killed here, counted, and reported to the caller as :class:`_WorkerLost` carrying the error its item
gets; the supervisor then starts a replacement (docs/robustness.md).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.reduction import send_handle
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.clock import Clock
from appliance.config import WorkersConfig
from appliance.errors import ApplianceError, DicomError, Overloaded, Unavailable
from appliance.workers.arena import InputBuffer
from appliance.workers.channel import Channel
from appliance.workers.child import WorkerSpec, worker_main

if TYPE_CHECKING:
    from appliance.workers.pool import Job

__all__ = ["WorkerProcesses"]

log = logging.getLogger(__name__)

_CONTEXT = multiprocessing.get_context("forkserver")


def exit_text(code: int | None) -> str:
    """How a worker process ended, for a log line: ``killed by SIGKILL``, ``exit code 3``, ...

    Under the forkserver a negative exit code is the signal; 255 is also what ``multiprocessing`` reports when it
    could not learn the status (the forkserver itself killed, e.g. by a kill of the whole process group), so it
    says so rather than passing for the worker's own exit (ops review, session 14: a SIGKILL logged as 255).
    """
    if code is None:
        return "exit status not known yet"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == 255:
        return "exit code 255 (or killed: the forkserver could not report its status)"
    return f"exit code {code}"
# Workers fork from a server that has already imported the decoders: a replacement is ready in milliseconds.
_CONTEXT.set_forkserver_preload(["appliance.workers.child"])


class _WorkerLost(Exception):
    def __init__(self, reason: str, error: ApplianceError) -> None:
        super().__init__(reason)
        self.reason = reason  # metrics label: crashed, timeout, memory, recycle, start
        self.error = error


class WorkerProcesses:
    """The preprocessing worker processes of a pool: started, heard from within a budget, retired and counted."""

    def __init__(self, spec: WorkerSpec, config: WorkersConfig, *, workers: int, clock: Clock,
                 on_restart: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.config = config
        self.workers = workers
        self.clock = clock
        self.on_restart = on_restart or (lambda reason: None)
        self._cond = threading.Condition()
        self._procs: dict[int, multiprocessing.process.BaseProcess] = {}
        self._stopping = False
        self.restarts = 0
        self.last_progress = self.clock.monotonic()
        self._started = 0  # workers that reported ready at least once
        self._inputs: list[InputBuffer] = []  # each worker's input buffer (the pool's start() creates them)

    def wait_started(self, timeout_s: float) -> bool:
        """Block until every worker has started once (or ``timeout_s``); True if they all did."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._started < self.workers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def _spawn(self, index: int) -> tuple[multiprocessing.process.BaseProcess, Channel]:
        pipe, child = _CONTEXT.Pipe(duplex=True)
        proc = _CONTEXT.Process(target=worker_main, args=(child, self.spec), name=f"appliance-worker-{index}",
                                daemon=True)
        proc.start()
        child.close()
        parent = Channel(pipe, proc.sentinel)
        with self._cond:
            self._procs[index] = proc
        try:
            if self._inputs:  # its own input buffer, as a descriptor: the first message the worker reads
                send_handle(pipe, self._inputs[index].fd, proc.pid or 0)
            msg = self._recv(parent, proc, self.config.start_timeout_s)
        except OSError as e:
            _kill(proc)
            raise _WorkerLost("start", Unavailable(f"worker did not start: {e}")) from None
        except _WorkerLost:
            _kill(proc)
            raise
        if msg[0] != "ready":
            _kill(proc)
            raise _WorkerLost("start", Unavailable("worker did not start"))
        log.debug("preprocessing worker %d started (pid %d)", index, proc.pid)
        with self._cond:
            self._started += 1
            self._cond.notify_all()
        return proc, parent

    def _respawn_for(self, index: int, job: Job) -> tuple[multiprocessing.process.BaseProcess, Channel]:
        """Start a new worker for ``job``; if that fails, answer the job (not its file's fault), raise _WorkerLost."""
        if self._stopping:
            job.fail(Unavailable("service is shutting down", reason="DRAINING"))
            raise _WorkerLost("start", Unavailable("stopping"))
        try:
            return self._spawn(index)
        except _WorkerLost as lost:
            log.error("preprocessing worker %d failed to start: %s; retrying", index, lost)
            job.fail(Unavailable("no preprocessing worker could be started (the daemon's log says why); retry",
                                 reason="DECODER_LOST"))
            raise

    def _retire(self, index: int, proc: multiprocessing.process.BaseProcess, reason: str, detail: str) -> None:
        """Kill a worker and count the restart, before the item it held is answered."""
        _kill(proc)
        with self._cond:
            self.restarts += 1
        if reason != "recycle":
            log.warning("preprocessing worker %d replaced (%s): %s", index, reason, detail)
        try:
            self.on_restart(reason)
        except Exception as e:  # noqa: BLE001 - metrics must never stop supervision
            log.error("restart observer failed: %s", e)

    def _recv(self, conn: Channel, proc: multiprocessing.process.BaseProcess, budget_s: float,
              index: int | None = None) -> Any:
        """Wait for one message within ``budget_s``.

        a dead, silent or broken worker is killed, counted and raised as _WorkerLost.
        """
        if not conn.poll(max(0.0, budget_s)):
            if index is not None:
                self._retire(index, proc, "timeout", f"no answer within {budget_s:.1f} s")
            raise _WorkerLost(
                "timeout",
                Overloaded(f"decoding ran past its time budget of {budget_s:.1f} s (config key "
                           "workers.step_timeout_s, or the request deadline)", retry_after_s=None,
                           reason="DECODER_TIME_LIMIT"),
            )
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            proc.join(0.2)
            how = exit_text(proc.exitcode)
            if index is not None:
                self._retire(index, proc, "crashed", how)
            raise _WorkerLost(
                "crashed",
                DicomError(f"decoder failed: the preprocessing worker died on this input ({how})",
                           field="dicom.PixelData"),
            ) from None
        self.last_progress = self.clock.monotonic()
        return msg

    def _proc_for(self) -> tuple[int, multiprocessing.process.BaseProcess]:
        index = int(threading.current_thread().name.rsplit("-", 1)[1])
        with self._cond:
            return index, self._procs[index]


def _scrub(inbox: np.ndarray | None, size: int) -> None:
    """Zero a file left in a worker's input buffer by a worker that was killed before it copied the file out."""
    if inbox is not None:
        inbox[:size] = 0


def _kill(proc: multiprocessing.process.BaseProcess) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(1.0)
