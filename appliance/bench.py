"""``appliance bench``: load generator and JSON report (a stable interface).

By default it starts the daemon it needs on loopback (a subprocess, ``appliance serve``), drives it, stops it,
then does the same with overlap switched off (``--no-overlap``: preprocessing on the engine thread) to measure
``sequential_throughput_per_s`` on the same configuration. With ``--target`` it drives a running daemon and
skips the comparison. The workload is real DICOM from :mod:`appliance.synthetic` in a named transfer-syntax mix.

Report fields: ``throughput_per_s``, ``latency_ms`` {p50, p90, p99, max}, ``stages_ms``
{preprocess_per_item, engine_per_batch} (server-side medians from GetStatus), ``batch_fill``, ``errors``
(counts by status code), ``sequential_throughput_per_s``, ``speedup_vs_sequential``, plus the configuration.
With ``--scrape-hz`` a Prometheus-like scraper fetches ``/metrics`` during the measurement (``scrape``: hz,
count, mean ms), to check that serving metrics does not slow the data path (docs/monitoring.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from appliance import __version__
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc

__all__ = ["main", "run_load"]

SCHEMA_VERSION = 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_load(
    target: str,
    files: list[bytes],
    *,
    concurrency: int,
    duration_s: float | None,
    requests: int | None,
    pipeline: str = "",
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Drive ``target`` with ``concurrency`` closed-loop clients; return throughput, latencies and errors."""
    options = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    counter = iter(range(10**12))
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = pb_grpc.InferenceStub(channel)
        t_start = time.monotonic()
        stop_at = t_start + duration_s if duration_s else None

        async def client() -> None:
            while True:
                i = next(counter)
                if requests is not None and i >= requests:
                    return
                if stop_at is not None and time.monotonic() >= stop_at:
                    return
                req = pb.AnalyzeRequest(dicom=files[i % len(files)], pipeline=pipeline, request_id=f"bench-{i}")
                t0 = time.monotonic()
                try:
                    await stub.Analyze(req, timeout=timeout_s)
                    latencies.append((time.monotonic() - t0) * 1000.0)
                    errors["OK"] += 1
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.monotonic() - t_start
        status = await stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    lat = np.asarray(latencies) if latencies else np.zeros(1)
    return {
        "requests": int(sum(errors.values())),
        "elapsed_s": round(elapsed, 3),
        "throughput_per_s": round(len(latencies) / elapsed, 2) if elapsed > 0 else 0.0,
        "latency_ms": {
            "p50": round(float(np.percentile(lat, 50)), 2),
            "p90": round(float(np.percentile(lat, 90)), 2),
            "p99": round(float(np.percentile(lat, 99)), 2),
            "max": round(float(lat.max()), 2),
        },
        "stages_ms": {
            "preprocess_per_item": round(status.latency_ms["preprocess"].p50, 2),
            "engine_per_batch": round(status.latency_ms["engine"].p50, 2),
            "queue": round(status.latency_ms["queue"].p50, 2),
        },
        "batch_fill": round(status.batch_fill, 3),
        "errors": {k: v for k, v in errors.items() if k != "OK"},
        "server": {
            "model": status.model.name,
            "precision": status.model.precision,
            "backend": status.model.backend,
            "batch_size": status.model.batch_size,
            "batches": status.batches,
        },
    }


class _Daemon:
    """An ``appliance serve`` subprocess on a free loopback port."""

    def __init__(self, extra: list[str], log_path: Path) -> None:
        self.port = _free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{_free_port()}/metrics"  # never the default 9400
        listen = ["--metrics-listen", self.metrics_url.split("/")[2]]
        cmd = [sys.executable, "-m", "appliance.cli", "serve", "--listen", self.target, *listen, *extra]
        self.log = log_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {self.proc.returncode}; see {self.log.name}")
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service="appliance.v1.Inference"), timeout=1)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise TimeoutError(f"daemon not SERVING within {timeout_s} s; see {self.log.name}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
        finally:
            self.log.close()


class _Scraper:
    """Fetches a /metrics URL at a fixed rate on its own thread, like a Prometheus server would."""

    def __init__(self, url: str, hz: float) -> None:
        self.url, self.period = url, 1.0 / hz
        self.times: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                self.times.append(time.monotonic() - t0)
            except OSError:
                self.errors += 1
            next_t += self.period
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def report(self) -> dict[str, Any]:
        mean = float(np.mean(self.times)) * 1e3 if self.times else 0.0
        return {"hz": round(1.0 / self.period, 3), "scrapes": len(self.times), "errors": self.errors,
                "mean_ms": round(mean, 3)}  # fmt: skip


def _drive(target: str, files: list[bytes], args: argparse.Namespace, metrics_url: str = "") -> dict[str, Any]:
    """One measurement with the command line's load settings (and a /metrics scraper with --scrape-hz)."""
    load = run_load(
        target,
        files,
        concurrency=args.concurrency,
        duration_s=args.duration,
        requests=args.requests,
        pipeline=args.pipeline,
    )
    url = args.metrics_url or metrics_url
    if not args.scrape_hz:
        return asyncio.run(load)
    if not url:
        load.close()
        raise SystemExit("--scrape-hz with --target needs --metrics-url")
    with _Scraper(url, args.scrape_hz) as scraper:
        result = asyncio.run(load)
    return {**result, "scrape": scraper.report()}


def _measure(args: argparse.Namespace, files: list[bytes], extra: list[str], logdir: Path, tag: str) -> dict[str, Any]:
    daemon = _Daemon(extra, logdir / f"daemon-{tag}.log")
    try:
        daemon.wait_serving()
        if args.warmup:  # let caches, the batch-time estimate and the thread pools settle
            asyncio.run(
                run_load(
                    daemon.target,
                    files,
                    concurrency=args.concurrency,
                    duration_s=None,
                    requests=args.warmup,
                    pipeline=args.pipeline,
                )
            )
        return _drive(daemon.target, files, args, daemon.metrics_url)
    finally:
        daemon.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the report and write it with ``--json FILE``."""
    from appliance import synthetic

    parser = argparse.ArgumentParser(prog="appliance bench", description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="drive a running daemon at ADDR (skips the sequential comparison)")
    parser.add_argument("--workload", default="mixed", choices=sorted(synthetic.WORKLOADS))
    parser.add_argument("--concurrency", type=int, default=16)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--duration", type=float, help="seconds of load per measurement")
    group.add_argument("--requests", type=int, help="requests per measurement")
    parser.add_argument("--files", type=int, default=64, help="distinct DICOM instances in the workload")
    parser.add_argument("--warmup", type=int, default=32, help="requests before measuring")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pipeline", default="")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--scrape-hz", type=float, default=0.0, help="scrape /metrics at this rate while measuring")
    parser.add_argument("--metrics-url", default="", help="the /metrics URL to scrape (default: the spawned daemon's)")
    parser.add_argument("serve_args", nargs="*", help="extra `appliance serve` arguments after --")
    args = parser.parse_args(argv)
    if args.duration is None and args.requests is None:
        args.duration = 20.0
    t0 = time.monotonic()
    files = synthetic.workload(args.workload, args.files, args.seed)
    gen_s = time.monotonic() - t0
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "appliance_version": __version__,
        "workload": args.workload,
        "workload_files": len(files),
        "workload_mean_bytes": int(np.mean([len(f) for f in files])),
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "requests": args.requests,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
        "workload_generation_s": round(gen_s, 2),
    }
    if args.target:
        report.update(_drive(args.target, files, args))
        report["target"] = args.target
    else:
        with tempfile.TemporaryDirectory(prefix="appliance-bench-") as tmp:
            logdir = Path(tmp)
            report.update(_measure(args, files, list(args.serve_args), logdir, "overlap"))
            sequential = _measure(args, files, [*args.serve_args, "--no-overlap"], logdir, "sequential")
        report["sequential"] = sequential
        report["sequential_throughput_per_s"] = sequential["throughput_per_s"]
        seq = sequential["throughput_per_s"]
        report["speedup_vs_sequential"] = round(report["throughput_per_s"] / seq, 3) if seq else None
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if not report.get("errors") else 1
