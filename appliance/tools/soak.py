"""``make soak DURATION=…`` / ``python -m appliance.tools.soak``: a long run at ~80 % of capacity, watching for leaks.

It starts ``appliance serve`` (the configuration's model and backend, a free loopback port), measures capacity
with a short closed-loop burst (:func:`appliance.tools.bench.run_load`), then sends Poisson arrivals at
``--load`` × capacity for ``--duration`` seconds. A fraction of calls is cancelled by the client after a random
delay (``--cancel``), and a trickle of bad inputs (truncated, bit-flipped, not DICOM; ``--bad``) is mixed in.
Every ``--interval`` seconds it samples the daemon (and its child processes): RSS, open file descriptors and
threads from ``/proc``, plus the latency percentiles and outcome counts of that interval.

The report (``--json``) holds the samples and a summary: RSS growth after warm-up, median of the first quarter
against median of the last (the figure to watch: it should stay under 5 % over 30 minutes), fd and thread
counts at both ends, latency percentiles per interval. ``--plot`` draws RSS, fds/threads and latency over
time (needs matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools.bench import _Daemon, run_load

__all__ = ["bad_inputs", "main", "proc_sample", "soak"]

SCHEMA_VERSION = 1


def _children(pid: int) -> list[int]:
    """Direct and indirect child processes of ``pid`` (decoder workers), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        frontier += kids
    return out


def proc_sample(pid: int) -> dict[str, float]:
    """RSS (MiB, the process and its children), open fds and threads of ``pid`` from /proc."""
    rss_kib, threads, fds = 0, 0, 0
    for i, p in enumerate([pid, *_children(pid)]):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kib += int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            if i == 0:
                raise
    return {"rss_mib": round(rss_kib / 1024, 1), "fds": fds, "threads": threads}


def bad_inputs(good: bytes, seed: int) -> list[bytes]:
    """Invalid requests: truncated, bit-flipped in the header, not DICOM at all."""
    rng = random.Random(seed)
    flipped = bytearray(good)
    for _ in range(16):
        i = rng.randrange(132, min(len(good), 1200))
        flipped[i] ^= 1 << rng.randrange(8)
    garbage = b"\0" * 128 + b"NOPE" + bytes(rng.randrange(256) for _ in range(4096))
    return [good[: len(good) // 3], bytes(flipped), garbage]


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    a = np.asarray(values)
    return {k: round(float(np.percentile(a, q)), 2) for k, q in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "max": round(float(a.max()), 2)
    }


async def soak(
    target: str,
    pid: int,
    files: list[bytes],
    *,
    rate_per_s: float,
    duration_s: float,
    interval_s: float,
    cancel_fraction: float,
    bad_fraction: float,
    seed: int = 1,
    max_in_flight: int = 256,
) -> list[dict[str, Any]]:
    """Open-loop load at ``rate_per_s``; return one sample per interval."""
    rng = random.Random(seed)
    bad = bad_inputs(files[0], seed)
    samples: list[dict[str, Any]] = []
    window: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()
    in_flight: set[asyncio.Task[None]] = set()
    options = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = pb_grpc.InferenceStub(channel)

        async def one(i: int) -> None:
            is_bad = rng.random() < bad_fraction
            data = bad[i % len(bad)] if is_bad else files[i % len(files)]
            call = stub.Analyze(pb.AnalyzeRequest(dicom=data, request_id=f"soak-{i}"), timeout=30)
            t0 = time.monotonic()
            if not is_bad and rng.random() < cancel_fraction:
                await asyncio.sleep(rng.uniform(0.0, 0.05))
                call.cancel()
            try:
                await call
                window.append((time.monotonic() - t0) * 1000.0)
                outcomes["OK"] += 1
            except asyncio.CancelledError:
                outcomes["CANCELLED_BY_CLIENT"] += 1
            except grpc.aio.AioRpcError as e:
                key = "CANCELLED_BY_CLIENT" if e.code() == grpc.StatusCode.CANCELLED else e.code().name
                outcomes[("BAD_INPUT:" if is_bad else "") + key] += 1

        t_start = time.monotonic()
        next_sample = t_start + interval_s
        next_arrival = t_start
        i = 0
        while (now := time.monotonic()) < t_start + duration_s:
            if now >= next_sample:
                sample = {"t_s": round(now - t_start, 1), **proc_sample(pid), "latency_ms": _percentiles(window)}
                sample["completed_per_s"] = round(len(window) / interval_s, 2)
                sample["outcomes"] = dict(outcomes)
                sample["in_flight"] = len(in_flight)
                samples.append(sample)
                window, outcomes = [], collections.Counter()
                next_sample += interval_s
            if now >= next_arrival and len(in_flight) < max_in_flight:
                task = asyncio.create_task(one(i))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                i += 1
                next_arrival += rng.expovariate(rate_per_s)
            await asyncio.sleep(max(0.0, min(next_arrival, next_sample) - time.monotonic()))
        await asyncio.gather(*in_flight, return_exceptions=True)
    return samples


def summarize(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """RSS growth after warm-up, fd/thread drift, and the run's outcome totals.

    RSS swings with the allocator and the workload's mix of image sizes, so growth compares the median of the
    first quarter of the steady samples with the median of the last quarter, and a least-squares trend over all
    of them is given too (endpoints are reported as well). Both need a window of many swings: minutes, not
    seconds.
    """
    steady = [s for s in samples if s["t_s"] >= warmup_s] or samples
    first, last = steady[0], steady[-1]
    quarter = max(1, len(steady) // 4)
    rss_first = float(np.median([s["rss_mib"] for s in steady[:quarter]]))
    rss_last = float(np.median([s["rss_mib"] for s in steady[-quarter:]]))
    totals: collections.Counter[str] = collections.Counter()
    for s in samples:
        totals.update(s["outcomes"])
    trend = 0.0  # least-squares slope of RSS over the steady samples, MiB per hour: robust to the sawtooth
    if len(steady) >= 3:
        trend = float(np.polyfit([s["t_s"] for s in steady], [s["rss_mib"] for s in steady], 1)[0]) * 3600
    mean_rss = float(np.mean([s["rss_mib"] for s in steady]))
    half = max(1, len(steady) // 2)
    peak_first = max(s["rss_mib"] for s in steady[:half])
    peak_last = max(s["rss_mib"] for s in steady[half:] or steady)
    return {
        "warmup_s": warmup_s,
        "rss_trend_mib_per_hour": round(trend, 1),
        "rss_trend_pct_per_30_min": round(100.0 * trend / 2 / mean_rss, 2),
        "rss_peak_growth_pct": round(100.0 * (peak_last - peak_first) / peak_first, 2),  # max, 2nd vs 1st half
        "rss_mib_median_first_quarter": round(rss_first, 1),
        "rss_mib_median_last_quarter": round(rss_last, 1),
        "rss_growth_pct": round(100.0 * (rss_last - rss_first) / rss_first, 2),
        "rss_mib_after_warmup": first["rss_mib"],
        "rss_mib_end": last["rss_mib"],
        "rss_mib_min": min(s["rss_mib"] for s in steady),
        "rss_mib_max": max(s["rss_mib"] for s in steady),
        "fds_after_warmup": first["fds"],
        "fds_end": last["fds"],
        "fds_max": max(s["fds"] for s in steady),
        "threads_after_warmup": first["threads"],
        "threads_end": last["threads"],
        "threads_max": max(s["threads"] for s in steady),
        "p99_ms_first_interval_after_warmup": first["latency_ms"]["p99"],
        "p99_ms_last_interval": last["latency_ms"]["p99"],
        "outcomes": dict(totals),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """RSS, fds/threads and latency over time, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [s["rss_mib"] for s in samples])
    axes[0].set_ylabel("RSS (MiB)")
    axes[0].axvline(report["summary"]["warmup_s"] / 60, color="grey", ls=":")
    axes[1].plot(t, [s["fds"] for s in samples], label="open fds")
    axes[1].plot(t, [s["threads"] for s in samples], label="threads")
    axes[1].legend()
    for q in ("p50", "p90", "p99"):
        axes[2].plot(t, [s["latency_ms"][q] for s in samples], label=q)
    axes[2].set_ylabel("latency (ms)")
    axes[2].set_xlabel("minutes")
    axes[2].legend()
    fig.suptitle(
        f"soak: {report['rate_per_s']:.1f} req/s ({report['load']:.0%} of {report['capacity_per_s']:.1f}), "
        f"RSS growth {report['summary']['rss_growth_pct']:+.1f} % after warm-up"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print the summary; write ``--json`` and ``--plot``."""
    from appliance.tools import synthetic

    parser = argparse.ArgumentParser(prog="python -m appliance.tools.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of soak (after the capacity probe)")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of measured capacity")
    parser.add_argument("--interval", type=float, default=0.0, help="seconds per sample (default duration/60)")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds excluded from RSS growth (default 10 %%)")
    parser.add_argument("--cancel", type=float, default=0.05, help="fraction of calls cancelled by the client")
    parser.add_argument("--bad", type=float, default=0.02, help="fraction of calls with invalid input")
    parser.add_argument("--probe-s", type=float, default=15.0, help="seconds of the capacity probe")
    parser.add_argument("--workload", default="mixed", choices=sorted(synthetic.WORKLOADS))
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--json", type=Path, default=Path("soak.json"))
    parser.add_argument("--plot", type=Path, default=Path("soak.png"))
    parser.add_argument("serve_args", nargs="*", help="extra `appliance serve` arguments after --")
    args = parser.parse_args(argv)
    interval = args.interval or max(1.0, args.duration / 60)
    warmup = args.warmup or 0.1 * args.duration
    files = synthetic.workload(args.workload, args.files, 7)
    with tempfile.TemporaryDirectory(prefix="appliance-soak-") as tmp:
        daemon = _Daemon(list(args.serve_args), Path(tmp) / "daemon.log")
        try:
            daemon.wait_serving()
            probe = asyncio.run(run_load(daemon.target, files, concurrency=16, duration_s=args.probe_s, requests=None))
            capacity = probe["throughput_per_s"]
            rate = args.load * capacity
            samples = asyncio.run(
                soak(
                    daemon.target,
                    daemon.proc.pid,
                    files,
                    rate_per_s=rate,
                    duration_s=args.duration,
                    interval_s=interval,
                    cancel_fraction=args.cancel,
                    bad_fraction=args.bad,
                )
            )
        finally:
            rc = daemon.stop()
            log_tail = (Path(tmp) / "daemon.log").read_text(errors="replace").splitlines()[-5:]
    report = {
        "schema_version": SCHEMA_VERSION,
        "duration_s": args.duration,
        "interval_s": interval,
        "capacity_per_s": capacity,
        "capacity_probe": {k: probe[k] for k in ("throughput_per_s", "latency_ms", "batch_fill", "server")},
        "load": args.load,
        "rate_per_s": round(rate, 2),
        "cancel_fraction": args.cancel,
        "bad_fraction": args.bad,
        "daemon_exit_code": rc,
        "daemon_log_tail": log_tail,
        "summary": summarize(samples, warmup),
        "samples": samples,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    try:
        plot(report, args.plot)
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[dev]')", file=sys.stderr)
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
