"""Batch-launch policies on shared cores: what a partial batch costs when the engine and the workers share CPUs.

A processor-sharing model of the appliance, fed with a bench report's measured costs (``costs.preprocess
.per_file_ms``, ``costs.engine_batch_ms``): ``cores`` CPUs shared equally by every busy task (the engine while
it runs a batch, each worker while it preprocesses a request); ``workers`` worker processes take requests first
come first served; the fixed batch costs ``t_engine(B)`` of CPU however many slots are real. Two launch rules:

* ``current``: when the engine is idle, launch what is ready once the oldest ready frame has waited
  ``max_wait`` (or B are ready) -- the daemon's rule (appliance/batching/policy.py);
* ``fill``: when the engine is idle, launch at once if B are ready or nothing else is admitted (a lone request
  never waits); otherwise wait for the frames still being preprocessed, at most ``cap`` past the oldest ready.

Load: closed loop with N clients, or open-loop Poisson. No gRPC, no IPC, no Python overhead, so absolute
throughput is optimistic; the comparison between rules is the point.

Usage: python bench/policy_sim.py bench.json [CORES=2] [WORKERS=2]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def decide(rule: str, t: float, oldest: float, n_ready: int, pending: int, batch: int, max_wait: float,
           cap: float) -> tuple[bool, float]:
    """(launch now?, when to look again) for an idle engine with ``n_ready`` ready and ``pending`` admitted."""
    if n_ready >= batch:
        return True, float("inf")
    if rule == "current":
        return t - oldest >= max_wait, oldest + max_wait
    return pending == 0 or t - oldest >= cap, oldest + cap


def run(pre: np.ndarray, t_eng: float, batch: int, *, cores: int, workers: int, rule: str, max_wait: float,
        cap: float, clients: int = 0, rate: float = 0.0, horizon: float = 60_000.0, seed: int = 0) -> dict:
    """Simulate ``horizon`` ms; return throughput (1/s), mean batch, p50/p99 latency (ms)."""
    rng = np.random.default_rng(seed)
    t = 0.0
    k_next = 0  # next file index
    queue: list[tuple[float, float]] = []  # (arrival, pre work) waiting for a worker
    busy: list[list[float]] = []  # [remaining work, arrival] per busy worker
    ready: list[tuple[float, float]] = []  # (arrival, ready time)
    engine: list | None = None  # [remaining work, [arrivals]]
    latencies: list[float] = []
    batches: list[int] = []
    next_arrival = rng.exponential(1000.0 / rate) if rate else float("inf")

    def admit(now: float) -> None:
        nonlocal k_next
        queue.append((now, float(pre[k_next % len(pre)])))
        k_next += 1

    for _ in range(clients):
        admit(0.0)
    while t < horizon:
        while queue and len(busy) < workers:
            arr, work = queue.pop(0)
            busy.append([work, arr])
        # launch decision
        wait_until = float("inf")
        if engine is None and ready:
            go, wait_until = decide(rule, t, min(r for _, r in ready), len(ready), len(queue) + len(busy), batch,
                                    max_wait, cap)
            if go:
                ready.sort()
                take, ready[:] = ready[:batch], ready[batch:]
                engine = [t_eng, [a for a, _ in take]]
                batches.append(len(take))
                wait_until = float("inf")
        n_active = len(busy) + (engine is not None)
        speed = min(1.0, cores / n_active) if n_active else 1.0
        dt = min([w[0] / speed for w in busy] + ([engine[0] / speed] if engine else [])
                 + [next_arrival - t, wait_until - t, horizon - t])
        dt = max(dt, 1e-9)
        t += dt
        for w in busy:
            w[0] -= dt * speed
        if engine:
            engine[0] -= dt * speed
        for w in [w for w in busy if w[0] <= 1e-9]:
            busy.remove(w)
            ready.append((w[1], t))
        if engine and engine[0] <= 1e-9:
            for arr in engine[1]:
                latencies.append(t - arr)
                if clients:
                    admit(t)
            engine = None
        if t >= next_arrival:
            admit(t)
            next_arrival = t + rng.exponential(1000.0 / rate)
    lat = np.asarray(latencies[len(latencies) // 10:])
    return {"throughput_per_s": round(len(latencies) / horizon * 1000.0, 1),
            "mean_batch": round(float(np.mean(batches)), 2) if batches else 0.0,
            "p50": round(float(np.percentile(lat, 50)), 1), "p99": round(float(np.percentile(lat, 99)), 1),
            "jitter": round(float(np.percentile(lat, 99) / np.percentile(lat, 50)), 2)}


def main(argv: list[str]) -> int:
    r = json.loads(Path(argv[1]).read_text())
    cores = int(argv[2]) if len(argv) > 2 else 2
    workers = int(argv[3]) if len(argv) > 3 else 2
    c = r["costs"]
    pre, t_eng, batch = np.asarray(c["preprocess"]["per_file_ms"]), c["engine_batch_ms"], c["batch_size"]
    rules = {"current (max_wait 5 ms)": ("current", 5.0, 0.0), "fill-aware (cap = t_engine)": ("fill", 0.0, t_eng)}
    print(f"{cores} cores, {workers} workers, B={batch}, t_engine={t_eng:.1f} ms, mean t_pre={pre.mean():.2f} ms")
    cap_current = run(pre, t_eng, batch, cores=cores, workers=workers, rule="current", max_wait=5.0, cap=0.0,
                      clients=32)["throughput_per_s"]
    for n in (1, 4, 16):
        for name, (rule, mw, cap) in rules.items():
            print(f"closed loop {n:2d}: {name:28s}",
                  run(pre, t_eng, batch, cores=cores, workers=workers, rule=rule, max_wait=mw, cap=cap, clients=n))
    rate = 0.7 * cap_current
    for name, (rule, mw, cap) in rules.items():
        print(f"Poisson {rate:.0f}/s:   {name:28s}",
              run(pre, t_eng, batch, cores=cores, workers=workers, rule=rule, max_wait=mw, cap=cap, rate=rate))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
