"""The process around the :class:`~appliance.serving.app.App`: signals, start, serve until stopped, drain, exit code.

SIGTERM and SIGINT drain and return 0; an engine death drains and returns :data:`EX_RESTART` so that the service
manager starts a fresh process (docs/operations.md); SIGHUP is ignored (no live reload: config is read once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

from appliance.config import Config
from appliance.heap import DAEMON_ARENAS, DAEMON_MAX_BLOCK, keep_heap
from appliance.serving.app import App
from appliance.serving.notify import Notifier

__all__ = ["EX_RESTART", "serve"]

log = logging.getLogger(__name__)


#: sysexits.h EX_SOFTWARE: the process ended itself so the service manager restarts it (an engine death).
EX_RESTART = 70


async def serve(config: Config, *, notifier: Notifier | None = None) -> int:
    """Run the daemon until SIGTERM/SIGINT (drain, return 0) or an engine death (drain, return :data:`EX_RESTART`)."""
    # The daemon copies each request's bytes too; a few arenas and large blocks mapped keep its memory bounded
    keep_heap(config.workers.heap_keep_bytes, max_block=DAEMON_MAX_BLOCK, arenas=DAEMON_ARENAS)
    # CUDA numbers GPUs in PCI order, as NVML does, so the thermometer watches the engine's GPU (nvml_index)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    app = App(config, notifier=notifier)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[str] = []  # which signal asked for the stop, for the log line (SIGINT was logged as SIGTERM)

    def on_signal(name: str) -> None:
        received.append(name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    # No live reload: config is read once. An accidental SIGHUP must not take the service down.
    loop.add_signal_handler(signal.SIGHUP, lambda: log.warning("SIGHUP ignored: restart the service to apply config"))
    t0 = time.monotonic()
    start = asyncio.create_task(app.start())
    done, _ = await asyncio.wait({start, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if start in done:
        if start.exception() is not None:
            # stop what started before the loop closes: a gRPC server left to the garbage collector printed a traceback
            # ("Event loop is closed"), and workers still being forked printed EOFErrors, after the one `cannot start:`
            # line (ops review, session 18)
            with contextlib.suppress(Exception):
                await app.stop(0)
        start.result()  # raise a startup failure (the process exits; workers are daemonic children)
        log.info("serving after %.1f s", time.monotonic() - t0)
        waits = {asyncio.create_task(stop.wait()), asyncio.create_task(app.fatal_event.wait())}
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
    else:
        start.cancel()
    code = EX_RESTART if app.fatal is not None and not received else 0
    if code:
        log.critical("%s: stopping so that the service manager restarts the process (exit %d)", app.fatal, code)
    else:
        log.info("%s: draining (grace %.1f s)", received[0] if received else "SIGTERM", config.server.grace_s)
    await app.stop()
    log.info("stopped")
    return code
