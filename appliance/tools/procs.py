"""Subprocess helpers shared by the tools that start servers (bench, its Triton peer, chaos) and by the tests."""

from __future__ import annotations

import signal
import socket
import subprocess

__all__ = ["free_port", "stop_process"]


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
