"""Load patterns for ``appliance bench``: closed loop at concurrency N, open-loop Poisson at rate R, bursts.

A *sender* is an async callable ``send(i) -> score`` that sends workload file ``i`` once and returns the
positive-class probability (or raises ``grpc.aio.AioRpcError``). :func:`appliance_sender` speaks the
appliance's ``Analyze`` RPC, :func:`kserve_sender` Triton's ``ModelInfer``: the same patterns then drive both
servers with the same files in the same order.

Open-loop latencies are measured from each request's *scheduled* arrival time, not from when the client got
round to sending it, so a stalled client cannot hide queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.kserve_v2 import KServeV2

__all__ = [
    "CHANNEL_OPTIONS",
    "LoadResult",
    "Sender",
    "appliance_sender",
    "bursts",
    "closed_loop",
    "kserve_sender",
    "latency_summary",
    "poisson",
]

Sender = Callable[[int], Awaitable[float]]
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]


class LoadResult:
    """What one pattern measured: latencies (ms), errors by status code, elapsed s, scores by file index."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.scores: dict[int, float] = {}
        self.by_arrival: dict[int, float] = {}  # open loop: latency (ms) by arrival index
        self.elapsed_s = 0.0
        self.offered = 0

    async def one(self, send: Sender, i: int, t_ref: float, timeout_s: float | None = None, k: int = -1) -> None:
        """Send file ``i``; record its latency from ``t_ref`` (monotonic s), its score or its error."""
        try:
            score = await (asyncio.wait_for(send(i), timeout_s) if timeout_s else send(i))
        except grpc.aio.AioRpcError as e:
            self.errors[e.code().name] += 1
            return
        except TimeoutError:
            self.errors["CLIENT_TIMEOUT"] += 1
            return
        ms = (time.monotonic() - t_ref) * 1000.0
        self.latencies.append(ms)
        self.scores[i] = score
        if k >= 0:
            self.by_arrival[k] = ms

    def summary(self) -> dict[str, Any]:
        """Throughput, latency percentiles, jitter (p99/p50) and errors."""
        ok = len(self.latencies)
        return {
            "requests": ok + int(sum(self.errors.values())),
            "elapsed_s": round(self.elapsed_s, 3),
            "throughput_per_s": round(ok / self.elapsed_s, 2) if self.elapsed_s > 0 else 0.0,
            "latency_ms": latency_summary(self.latencies),
            "errors": dict(self.errors),
        }


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """p50/p90/p99/max in ms and ``jitter`` = p99/p50 (zeros when empty)."""
    if not latencies:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "jitter": 0.0}
    lat = np.asarray(latencies)
    p50, p90, p99 = (float(np.percentile(lat, q)) for q in (50, 90, 99))
    return {"p50": round(p50, 2), "p90": round(p90, 2), "p99": round(p99, 2), "max": round(float(lat.max()), 2),
            "jitter": round(p99 / p50, 3) if p50 > 0 else 0.0}


def appliance_sender(channel: grpc.aio.Channel, files: list[bytes], pipeline: str = "",
                     positive: str = "nodule", timeout_s: float = 30.0) -> Sender:
    """``Analyze`` one file; the score is the first frame's ``positive`` probability."""
    stub = pb_grpc.InferenceStub(channel)
    counter = iter(range(10**12))

    async def send(i: int) -> float:
        req = pb.AnalyzeRequest(dicom=files[i % len(files)], pipeline=pipeline, request_id=f"bench-{next(counter)}")
        reply = await stub.Analyze(req, timeout=timeout_s)
        findings = reply.frames[0].findings
        for f in findings:
            if f.label == positive:
                return float(f.score)
        return 1.0 - float(findings[0].score)  # only the negative label was reported

    return send


def kserve_sender(channel: grpc.aio.Channel, files: list[bytes], model: str = "ct-nodule",
                  score_output: str = "prob", timeout_s: float = 30.0) -> Sender:
    """``ModelInfer`` one file as a BYTES tensor; the score is ``score_output``."""
    client = KServeV2(channel, model)

    async def send(i: int) -> float:
        out = await client.infer_dicom(files[i % len(files)], timeout=timeout_s)
        return float(out[score_output].reshape(-1)[0])

    return send


async def closed_loop(send: Sender, n_files: int, *, concurrency: int, duration_s: float | None = None,
                      requests: int | None = None, start: int = 0) -> LoadResult:
    """``concurrency`` clients, each sending its next request when the previous one is answered."""
    res = LoadResult()
    counter = iter(range(start, start + 10**12))
    t0 = time.monotonic()
    stop_at = t0 + duration_s if duration_s else None

    async def client() -> None:
        while True:
            i = next(counter)
            if requests is not None and i - start >= requests:
                return
            if stop_at is not None and time.monotonic() >= stop_at:
                return
            res.offered += 1
            await res.one(send, i % n_files, time.monotonic())

    await asyncio.gather(*(client() for _ in range(concurrency)))
    res.elapsed_s = time.monotonic() - t0
    return res


async def _open_loop(send: Sender, n_files: int, arrivals: np.ndarray, timeout_s: float) -> LoadResult:
    """Send request k at ``arrivals[k]`` s after the start, whatever is still outstanding."""
    res = LoadResult()
    tasks = []
    t0 = time.monotonic()
    for k, at in enumerate(arrivals):
        delay = t0 + float(at) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        res.offered += 1
        tasks.append(asyncio.ensure_future(res.one(send, k % n_files, t0 + float(at), timeout_s, k)))
    await asyncio.gather(*tasks)
    res.elapsed_s = max(time.monotonic() - t0, float(arrivals[-1]) if len(arrivals) else 0.0)
    return res


async def poisson(send: Sender, n_files: int, *, rate_per_s: float, duration_s: float, seed: int = 0,
                  timeout_s: float = 30.0) -> LoadResult:
    """Open loop: exponential inter-arrival times at ``rate_per_s`` for ``duration_s``."""
    rng = np.random.default_rng([seed, 23])
    n = max(1, int(rate_per_s * duration_s))
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
    res = await _open_loop(send, n_files, arrivals[arrivals < duration_s] if n > 1 else arrivals, timeout_s)
    res.elapsed_s = duration_s if res.elapsed_s < duration_s else res.elapsed_s
    return res


async def bursts(send: Sender, n_files: int, *, size: int, period_s: float, count: int,
                 timeout_s: float = 30.0) -> tuple[LoadResult, list[float]]:
    """``count`` bursts of ``size`` simultaneous requests, ``period_s`` apart (a series arriving at once).

    Returns the result and, per burst, the time (ms) until its last request was answered.
    """
    arrivals = np.repeat(np.arange(count, dtype=np.float64) * period_s, size)
    res = await _open_loop(send, n_files, arrivals, timeout_s)
    drain = [max((res.by_arrival.get(k, 0.0) for k in range(b * size, (b + 1) * size)), default=0.0)
             for b in range(count)]
    return res, [round(d, 2) for d in drain]
