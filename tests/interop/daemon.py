"""`appliance serve` as a real process on loopback (fake engine, model ct-nodule B=4) for interop clients."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from appliance.tools.procs import wait_serving
from tests.support import fake_daemon_config, free_port, stop_process

__all__ = ["appliance_serve"]


@contextlib.contextmanager
def appliance_serve(tmp: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Start the daemon in ``tmp``, wait for SERVING, yield its gRPC address, then SIGTERM it."""
    port = free_port()
    cfg = fake_daemon_config(tmp, [f"127.0.0.1:{port}"])
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    log_path = tmp / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    target = f"127.0.0.1:{port}"
    try:
        wait_serving(target, timeout_s, proc=proc, log=str(log_path))  # if the daemon exits, quotes its log
        yield target
    finally:
        stop_process(proc)
