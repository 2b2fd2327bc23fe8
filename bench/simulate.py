"""What the design could reach with zero overhead: a discrete-event model fed with the bench's measured costs.

The appliance's data path, idealised: ``workers`` preprocessing cores serve requests first come first served,
each taking the file's measured bytes-to-slot time; one engine core runs fixed batches of B taking the measured
full-batch time; the engine launches when B items are ready, or when it is idle and the oldest ready item has
waited ``max_wait``. No gRPC, no IPC, no Python, no other processes. Poisson arrivals at a fraction of the
model's own capacity. Its p99/p50 is a floor for the real daemon's on the same machine and workload.

Usage: python bench/simulate.py bench.json [FRACTION=0.7] [WORKERS=1] [MAX_WAIT_MS=5] [REQUESTS=200000]
"""

from __future__ import annotations

import heapq
import json
import sys
from pathlib import Path

import numpy as np


def simulate(pre_ms: list[float], engine_ms: float, batch: int, workers: int, max_wait_ms: float,
             rate_per_ms: float, n: int, seed: int = 0) -> np.ndarray:
    """Latencies (ms) of ``n`` Poisson arrivals; file k % len(pre_ms) for request k."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_ms, size=n))
    pre = np.asarray(pre_ms)[np.arange(n) % len(pre_ms)]
    free = [0.0] * workers  # when each preprocessing core is next free (FIFO over arrivals)
    heapq.heapify(free)
    ready_at = np.empty(n)
    for k in range(n):
        start = max(arrivals[k], heapq.heappop(free))
        ready_at[k] = start + pre[k]
        heapq.heappush(free, ready_at[k])
    order = np.argsort(ready_at, kind="stable")
    done = np.empty(n)
    engine_free = 0.0
    i = 0
    while i < n:
        # the engine considers the items ready by the time it is free; it waits for more only while idle
        t = max(engine_free, ready_at[order[i]])
        j = i
        while j < n and ready_at[order[j]] <= t and j - i < batch:
            j += 1
        if j - i < batch:
            deadline = max(t, ready_at[order[i]] + max_wait_ms)
            while j < n and j - i < batch and ready_at[order[j]] <= deadline:
                j += 1
            t = deadline if j - i < batch else max(t, ready_at[order[j - 1]])
        end = t + engine_ms
        done[order[i:j]] = end
        engine_free = end
        i = j
    return done - arrivals


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[1]).read_text())
    fraction = float(argv[2]) if len(argv) > 2 else 0.7
    workers = int(argv[3]) if len(argv) > 3 else 1
    max_wait = float(argv[4]) if len(argv) > 4 else 5.0
    n = int(argv[5]) if len(argv) > 5 else 200_000
    costs = report["costs"]
    pre, engine, batch = costs["preprocess"]["per_file_ms"], costs["engine_batch_ms"], costs["batch_size"]
    capacity = min(workers / float(np.mean(pre)), batch / engine)  # per ms
    lat = simulate(pre, engine, batch, workers, max_wait, fraction * capacity, n)[n // 10:]  # drop warm-up
    p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
    print(f"ideal model: {workers} preprocessing core(s) + 1 engine core, B={batch}, t_engine={engine:.1f} ms, "
          f"mean t_pre={np.mean(pre):.2f} ms, max_wait={max_wait:g} ms")
    print(f"capacity {1000 * capacity:.1f}/s; Poisson at {fraction:g} = {1000 * fraction * capacity:.1f}/s: "
          f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, p99/p50 {p99 / p50:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
