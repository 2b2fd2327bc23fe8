"""`appliance serve` as a real process on loopback (fake engine, model ct-nodule B=4) for interop clients."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

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
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"appliance serve exited: {log_path.read_text()[-2000:]}")
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"appliance serve not SERVING within {timeout_s} s")
                time.sleep(0.1)
        yield target
    finally:
        stop_process(proc)
