"""Side virtual environments for interop peers that cannot share the project's venv.

tritonclient (and PyTriton, which bundles tritonserver) need ``protobuf<7``, while our committed stubs need
``protobuf>=7.35`` (docs/oip.md), so each peer gets its own venv, built once from pinned requirements and cached
under ``$APPLIANCE_INTEROP_CACHE`` (default ``~/.cache/edge-appliance/venvs``), keyed by a hash of the
requirements. ``python -m tests.interop.venvs`` builds them all ahead of the tests (CI does, via
``make interop``); tests call :func:`ensure` and skip with the build error where a venv cannot be made.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["PEERS", "VenvUnavailable", "ensure", "libpython_env"]

#: peer -> pinned requirements (tritonclient 2.73 and PyTriton 0.7.0 are what docs/oip.md was checked with).
PEERS: dict[str, tuple[str, ...]] = {
    "tritonclient": ("tritonclient[grpc]==2.73.0", "numpy>=1.26"),
    # PyTriton pins numpy<2; onnxruntime runs the model inside the Triton Python callable.
    "pytriton": ("nvidia-pytriton==0.7.0", "onnxruntime>=1.20", "numpy<2"),
}


class VenvUnavailable(RuntimeError):
    """The side venv could not be built here (no network, no wheel for this platform, ...)."""


def _root() -> Path:
    default = Path.home() / ".cache" / "edge-appliance" / "venvs"
    return Path(os.environ.get("APPLIANCE_INTEROP_CACHE", default))


def ensure(peer: str, timeout_s: float = 900.0) -> Path:
    """Return the venv's python for ``peer``, building the venv first if needed."""
    requirements = PEERS[peer]
    key = hashlib.sha256("\n".join((sys.version, *requirements)).encode()).hexdigest()[:12]
    venv = _root() / f"{peer}-{key}"
    python = venv / "bin" / "python"
    done = venv / ".complete"
    if done.exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{peer}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; others wait and reuse
        if done.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        steps = (
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        )
        for cmd in steps:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise VenvUnavailable(f"{peer}: `{' '.join(cmd[:4])} ...` took over {timeout_s:.0f} s") from None
            if proc.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                raise VenvUnavailable(f"{peer}: {' '.join(cmd[2:5])} failed: {' | '.join(tail)}")
        done.write_text("\n".join(requirements) + "\n")
    return python


def libpython_env(python: Path) -> dict[str, str]:
    """Environment for a venv whose embedded-Python children (Triton's python backend stub) need the venv's
    own libpython first on ``LD_LIBRARY_PATH`` (otherwise the system's libpython is loaded against this
    interpreter's stdlib and model load fails; docs/scale-out.md)."""
    libdir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


if __name__ == "__main__":  # build every side venv (CI: make interop)
    for name in sys.argv[1:] or PEERS:
        print(f"{name}: {ensure(name)}")
