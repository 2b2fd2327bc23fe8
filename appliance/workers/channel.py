"""The daemon's end of one worker process's pipe, with the waits its supervisor thread needs.

``Connection.poll`` and ``Process.is_alive`` each build and tear down a selector on every call; a supervisor
asks several times per request, so this keeps one ``select.poll`` per question for the pipe's life
(docs/performance.md, section 2, "Session 10").
"""

from __future__ import annotations

import select
from multiprocessing.connection import Connection

__all__ = ["Channel"]


class Channel:
    """A duplex ``multiprocessing`` pipe to one worker, and that worker's exit sentinel."""

    def __init__(self, conn: Connection, sentinel: int) -> None:
        self.conn = conn
        self.send = conn.send
        self.send_bytes = conn.send_bytes
        self.recv = conn.recv
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)
        self._exit = select.poll()  # the process's sentinel: readable once it has exited (Process.is_alive's test)
        self._exit.register(sentinel, select.POLLIN)

    def poll(self, timeout_s: float) -> bool:
        """True when a message (or the end of the pipe: recv then raises EOFError) is waiting."""
        return bool(self._poller.poll(timeout_s * 1000.0))

    def dead(self) -> bool:
        """True once an idle worker has exited or closed its end (without building a selector, as ``is_alive``).

        Only for a worker between jobs: it never sends unasked, so anything readable is the end of the pipe, which
        shows as soon as the process dies; its exit sentinel only once the fork server has reaped it.
        """
        return bool(self._exit.poll(0)) or bool(self._poller.poll(0))
