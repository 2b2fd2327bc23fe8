"""Subprocess helpers shared by the tools that start servers (bench, its Triton peer, chaos) and by the tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from typing import Any

__all__ = ["free_port", "stop_process", "wait_serving"]


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM ``proc`` (a server drains on it) and wait; SIGKILL after ``timeout_s``. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def wait_serving(target: str, timeout_s: float = 60.0, *, proc: subprocess.Popen[bytes] | None = None,
                 service: str = "", log: str = "") -> None:
    """Poll gRPC health at ``target`` until ``service`` ("" = the server) is SERVING.

    Raises:
        RuntimeError: ``proc`` (the server, when given) exited first.
        TimeoutError: not SERVING within ``timeout_s``.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # the stubs' HealthStub does not declare Check
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server at {target} exited with {proc.returncode}{_see(log)}")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"server at {target} not SERVING within {timeout_s} s{_see(log)}")


def _see(log: str, lines: int = 12) -> str:
    """Where the server's log is, and its last ``lines`` lines: the caller may delete it (a temporary folder)."""
    if not log:
        return ""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return f"; see {log}"
    if not tail:
        return f"; {log} is empty"
    return f"; see {log}, which ends:\n" + "\n".join(f"  | {line}" for line in tail)
