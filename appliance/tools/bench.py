"""``appliance bench``: load generator and JSON report (a stable interface).

By default it starts the daemon it needs on loopback (a subprocess, ``appliance serve``), drives it, stops it,
then does the same with overlap switched off (``--no-overlap``: preprocessing on the engine thread) to measure
``sequential_throughput_per_s`` on the same configuration. With ``--target`` it drives a running daemon and
skips the comparison. The workload is real DICOM from :mod:`appliance.tools.synthetic` in a named transfer-syntax mix.

Report fields: ``throughput_per_s``, ``latency_ms`` {p50, p90, p99, max}, ``stages_ms``
{preprocess_per_item, engine_per_batch} (server-side medians from GetStatus), ``batch_fill``, ``errors``
(counts by status code), ``sequential_throughput_per_s``, ``speedup_vs_sequential``, plus the configuration.

Added by the side-by-side measurement (docs/performance.md), all optional:

* ``--costs``: ``costs`` (per-slice CPU costs on one pinned core: preprocessing by transfer syntax, engine
  per batch, FLOPs, single-thread SGEMM), ``ceiling`` (2-core ceiling and pipelined bound),
  ``engine_flops_ratio``, ``preprocess_uncompressed_ms``;
* ``--sweep 1,4,8,16``: ``sweep`` (closed loop at each concurrency: throughput, latency, server CPU and
  wake-ups per answered request); ``--poisson F``: open-loop Poisson at F x capacity; ``--bursts``;
* ``--peer triton``: the same load on a tuned Triton (``bench/peers/triton``), interleaved, ratios under
  ``peer``; ``--self-workload``: the overlap-vs-sequential comparison on another workload;
* ``targets``: each goal of docs/performance.md with its figure and ``met``; ``--plot PREFIX``: PNGs.

``--standard`` is the set ``make bench`` runs.

With ``--scrape-hz`` a Prometheus-like scraper fetches ``/metrics`` during the measurement (``scrape``: hz,
count, mean ms), to check that serving metrics does not slow the data path (docs/monitoring.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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

from appliance import __version__
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools.procs import free_port, stop_process, wait_serving

__all__ = ["main", "run_load"]

SCHEMA_VERSION = 1
REPO = Path(__file__).resolve().parents[2]


async def status_fields(stub: pb_grpc.InferenceStub) -> dict[str, Any]:
    """The report fields read from the daemon's GetStatus (server-side stage medians, batch fill, model)."""
    status = await stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    lat = status.latency_ms
    return {
        "stages_ms": {
            "preprocess_per_item": round(lat["preprocess"].p50, 2) if "preprocess" in lat else None,
            "engine_per_batch": round(lat["engine"].p50, 2) if "engine" in lat else None,
            "queue": round(lat["queue"].p50, 2) if "queue" in lat else None,
        },
        "batch_fill": round(status.batch_fill, 3),
        "server": {
            "model": status.model.name,
            "precision": status.model.precision,
            "backend": status.model.backend,
            "batch_size": status.model.batch_size,
            "batches": status.batches,
        },
    }


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
    from appliance.tools.loadgen import CHANNEL_OPTIONS, appliance_sender, closed_loop

    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        send = appliance_sender(channel, files, pipeline, timeout_s=timeout_s)
        res = await closed_loop(send, len(files), concurrency=concurrency, duration_s=duration_s, requests=requests)
        fields = await status_fields(pb_grpc.InferenceStub(channel))
    out = res.summary()
    out["latency_ms"].pop("jitter")
    return {**out, **fields}


class _Daemon:
    """An ``appliance serve`` subprocess on a free loopback port."""

    def __init__(self, extra: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics"  # never the default 9400
        listen = ["--metrics-listen", self.metrics_url.split("/")[2]]
        cmd = [sys.executable, "-m", "appliance.cli", "serve", "--listen", self.target, *listen, *extra]
        self.log = log_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        """The daemon's process (worker processes are its descendants)."""
        return self.proc.pid

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        """Block until the daemon's inference service is SERVING (RuntimeError if it exits first)."""
        wait_serving(self.target, timeout_s, proc=self.proc, service="appliance.v1.Inference", log=self.log.name)

    def stop(self) -> int:
        try:
            return stop_process(self.proc)
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


def _warm(target: str, files: list[bytes], args: argparse.Namespace) -> None:
    if args.warmup:  # let caches, the batch-time estimate and the thread pools settle
        asyncio.run(run_load(target, files, concurrency=args.concurrency, duration_s=None, requests=args.warmup,
                             pipeline=args.pipeline))


def _measure(args: argparse.Namespace, files: list[bytes], extra: list[str], logdir: Path, tag: str) -> dict[str, Any]:
    daemon = _Daemon(extra, logdir / f"daemon-{tag}.log")
    try:
        daemon.wait_serving()
        _warm(daemon.target, files, args)
        return _drive(daemon.target, files, args, daemon.metrics_url)
    finally:
        daemon.stop()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    from appliance.tools import synthetic

    parser = argparse.ArgumentParser(prog="appliance bench", description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="drive a running daemon at ADDR (skips the sequential comparison)")
    parser.add_argument("--target-pid", type=int, help="with --target: the daemon's pid, for CPU per request")
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
    parser.add_argument("--standard", action="store_true",
                        help="the standard set (make bench): quarters workload, costs, sweep 1,4,8,16, Poisson "
                             "at 0.7, bursts, tuned Triton peer, jpegls self-comparison, plots")
    parser.add_argument("--costs", action="store_true", help="measure per-slice CPU costs and the ceilings")
    parser.add_argument("--sweep", type=_ints, default=[], help="closed-loop concurrencies, e.g. 1,4,8,16")
    parser.add_argument("--poisson", type=float, default=0.0, help="open-loop Poisson at this fraction of capacity")
    parser.add_argument("--poisson-rate", type=float, default=0.0, help="open-loop Poisson at this rate (req/s)")
    parser.add_argument("--bursts", default="", help="SIZExPERIODxCOUNT, e.g. 32x2x4 (32 requests every 2 s)")
    parser.add_argument("--peer", choices=["none", "triton"], default="none")
    parser.add_argument("--peer-python", type=Path, help="the peer venv's python (default bench/peers/triton/.venv)")
    parser.add_argument("--peer-instances", type=_ints, default=[1, 2], help="Triton instance counts to try")
    parser.add_argument("--peer-delays-ms", type=_ints, default=[1, 5, 10], help="Triton queue delays to try")
    parser.add_argument("--peer-tune-s", type=float, default=8.0, help="seconds per tuning configuration")
    parser.add_argument("--self-workload", help="run the overlap-vs-sequential comparison on this workload")
    parser.add_argument("--no-sequential", action="store_true", help="skip the --no-overlap comparison")
    parser.add_argument("--workers", type=int, help="preprocessing cores for the pipelined bound (default cores-1)")
    parser.add_argument("--plot", help="write PREFIX-latency.png and PREFIX-throughput.png")
    parser.add_argument("--logs", type=Path, help="keep daemon and peer logs in this directory")
    parser.add_argument("--scrape-hz", type=float, default=0.0, help="scrape /metrics at this rate while measuring")
    parser.add_argument("--metrics-url", default="", help="the /metrics URL to scrape (default: the spawned daemon's)")
    parser.add_argument("serve_args", nargs="*", help="extra `appliance serve` arguments after --")
    return parser


def _apply_standard(args: argparse.Namespace) -> None:
    args.workload = "quarters" if args.workload == "mixed" else args.workload
    args.costs = True
    args.sweep = args.sweep or [1, 4, 8, 16]
    args.poisson = args.poisson or 0.7
    args.bursts = args.bursts or "32x2x4"
    args.peer = "triton" if args.peer == "none" else args.peer
    args.self_workload = args.self_workload or "jpegls"
    args.plot = args.plot or "bench"
    if args.duration is None and args.requests is None:
        args.duration = 12.0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the report and write it with ``--json FILE``."""
    from appliance.tools import synthetic

    args = _parser().parse_args(argv)
    if args.standard:
        _apply_standard(args)
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
    extended = (args.costs or args.sweep or args.poisson or args.poisson_rate or args.bursts or args.peer != "none"
                or args.self_workload)
    if args.target and not extended:
        report.update(_drive(args.target, files, args))
        report["target"] = args.target
    elif not extended:
        with tempfile.TemporaryDirectory(prefix="appliance-bench-") as tmp:
            logdir = Path(tmp)
            report.update(_measure(args, files, list(args.serve_args), logdir, "overlap"))
            sequential = _measure(args, files, [*args.serve_args, "--no-overlap"], logdir, "sequential")
        report["sequential"] = sequential
        report["sequential_throughput_per_s"] = sequential["throughput_per_s"]
        seq = sequential["throughput_per_s"]
        report["speedup_vs_sequential"] = round(report["throughput_per_s"] / seq, 3) if seq else None
    else:
        from appliance.tools.benchrun import run_extended

        with tempfile.TemporaryDirectory(prefix="appliance-bench-") as tmp:
            logdir = args.logs or Path(tmp)
            logdir.mkdir(parents=True, exist_ok=True)
            run_extended(args, files, report, logdir, _Daemon, _measure, _warm)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if not report.get("errors") else 1
