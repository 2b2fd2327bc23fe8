"""The Triton peer for ``appliance bench --peer triton``: start, readiness, tuning sweep, input check.

The peer runs in its own venv (``bench/peers/triton/setup.sh``; PyTriton's bundled Triton 2.51, the same
onnxruntime and decoder plugins as the appliance) and imports the appliance's DICOM and preprocessing code from
this checkout (``PYTHONPATH``), so both servers compute bit-identical model inputs: :func:`check_inputs`
proves it for the workload of each run. See ``bench/peers/triton/serve.py`` and docs/performance.md.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from appliance.serving.kserve_v2 import KServeV2
from appliance.tools.loadgen import CHANNEL_OPTIONS
from appliance.tools.procs import free_port, stop_process

__all__ = ["PEER_DIR", "REPO", "TritonPeer", "batch_stats", "check_inputs", "default_peer_python", "triton_metrics"]

REPO = Path(__file__).resolve().parents[2]  # the checkout (the peer imports appliance from here)
PEER_DIR = REPO / "bench" / "peers" / "triton"


def default_peer_python() -> Path:
    """The peer venv's interpreter (created by ``bench/peers/triton/setup.sh``)."""
    return PEER_DIR / ".venv" / "bin" / "python"


def _peer_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("NOTIFY_SOCKET", None)
    return env


class TritonPeer:
    """One ``serve.py`` process (PyTriton + tritonserver + Python-backend stubs) on free loopback ports."""

    def __init__(self, python: Path, *, instances: int, queue_delay_us: int, intra_op_threads: int = 1,
                 log_path: Path, pipeline: Path = REPO / "pipelines" / "ct-nodule.toml") -> None:
        if not Path(python).exists():
            raise FileNotFoundError(
                f"peer interpreter {python} not found; create the peer venv with bench/peers/triton/setup.sh "
                "(or make bench-peer)")
        self.instances, self.queue_delay_us, self.intra_op_threads = instances, queue_delay_us, intra_op_threads
        self.ready_s = 0.0
        self.port = free_port()
        self.metrics_port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        cmd = [str(python), str(PEER_DIR / "serve.py"), "--grpc-port", str(self.port),
               "--http-port", str(free_port()), "--metrics-port", str(self.metrics_port),
               "--instances", str(instances), "--queue-delay-us", str(queue_delay_us),
               "--intra-op-threads", str(intra_op_threads),
               "--models-dir", str(REPO / "models"), "--pipeline", str(pipeline)]
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=_peer_env(), cwd=REPO)

    @property
    def pid(self) -> int:
        """The PyTriton process (tritonserver and the stubs are its descendants)."""
        return self.proc.pid

    def config(self) -> dict[str, Any]:
        """The peer's tunables."""
        return {"instances": self.instances, "queue_delay_ms": self.queue_delay_us / 1000.0,
                "intra_op_threads": self.intra_op_threads}

    def wait_ready(self, timeout_s: float = 90.0) -> float:
        """Block until server and model are ready; return the seconds it took."""
        t0 = time.monotonic()

        async def poll() -> None:
            async with grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS) as channel:
                client = KServeV2(channel, "ct-nodule")
                while time.monotonic() - t0 < timeout_s:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"Triton peer exited with {self.proc.returncode}; see {self.log.name}")
                    try:
                        if await client.ready(timeout=1.0):
                            return
                    except grpc.aio.AioRpcError:
                        pass
                    await asyncio.sleep(0.25)
                raise TimeoutError(f"Triton peer not ready within {timeout_s} s; see {self.log.name}")

        asyncio.run(poll())
        return time.monotonic() - t0

    def stop(self) -> int:
        """SIGTERM (Triton drains and unloads), then SIGKILL after 30 s."""
        try:
            return stop_process(self.proc)
        finally:
            self.log.close()


_METRICS = ("nv_inference_count", "nv_inference_exec_count", "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us", "nv_inference_request_success")


def triton_metrics(port: int) -> dict[str, float]:
    """Triton's Prometheus counters for the model (request and execution counts, queue and compute µs)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in _METRICS and 'model="ct-nodule"' in line:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def batch_stats(before: dict[str, float], after: dict[str, float], batch: int) -> dict[str, float | None]:
    """Mean batch size, fill (mean / B) and mean queue ms between two :func:`triton_metrics` readings."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _METRICS}
    execs, reqs = d["nv_inference_exec_count"], d["nv_inference_count"]
    return {
        "mean_batch": round(reqs / execs, 2) if execs else None,
        "batch_fill": round(reqs / execs / batch, 3) if execs else None,
        "queue_ms": round(d["nv_inference_queue_duration_us"] / 1000.0 / reqs, 2) if reqs else None,
        "compute_ms_per_request": round(d["nv_inference_compute_infer_duration_us"] / 1000.0 / reqs, 2)
        if reqs else None,
    }


def check_inputs(python: Path, files: list[bytes], local_digest: str,
                 pipeline: Path = REPO / "pipelines" / "ct-nodule.toml") -> dict[str, Any]:
    """Compute the model-input digest of ``files`` through ``pipeline`` under the peer's interpreter; compare."""
    with tempfile.TemporaryDirectory(prefix="appliance-peer-inputs-") as tmp:
        for i, data in enumerate(files):
            (Path(tmp) / f"{i:04d}.dcm").write_bytes(data)
        out = subprocess.run([str(python), str(PEER_DIR / "check_inputs.py"), tmp, str(pipeline)],
                             capture_output=True, text=True,
                             env=_peer_env(), cwd=REPO, timeout=300, check=False)
    peer_digest = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    result: dict[str, Any] = {"identical": peer_digest == local_digest, "sha256": local_digest}
    if peer_digest != local_digest:
        result["peer_sha256"] = peer_digest or None
        result["peer_error"] = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else None
    return result
