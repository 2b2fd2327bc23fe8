"""Do this machine's cores slow each other down? The same work on one core alone, then on every core at once.

    python bench/core_contention.py [ROUNDS=3]

The 2-core ceiling (docs/performance.md, section 3) adds per-slice costs measured on one pinned core while the
other is idle. If the cores are hyperthreads of one physical core, or share a memory path that one busy core
saturates, two busy cores do less than twice one core's work, and the ceiling overstates what the machine can
do. This runs three workloads -- a single-thread SGEMM (numpy, 1 BLAS thread), the engine's batch (ONNX Runtime,
1 intra-op thread) and a JPEG 2000 decode -- as one process pinned to core 0, then as one process per core,
each pinned, started together, and prints each process's thread CPU per unit of work; then the engine beside a
JPEG 2000 decoder on the other core, which is what the daemon does under load. A ratio near 1.0 means
independent cores; 1.3-1.6 is what SMT siblings typically show.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _work(kind: str) -> tuple[Any, int]:
    """Return (a callable doing one unit of work, how many units make ~0.5 s)."""
    import numpy as np

    if kind == "sgemm":
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
        a = np.random.default_rng(0).standard_normal((384, 384)).astype(np.float32)
        return (lambda: a @ a), 200
    if kind == "engine":
        from appliance.manifest import load_manifest
        from appliance.tools import benchcost

        manifest = load_manifest(REPO / "models" / "ct-nodule" / "model.toml")
        sess = benchcost._session(manifest, None, 1)  # the daemon's session settings, 1 intra-op thread
        batch = {manifest.input.name: np.random.default_rng(0).random(tuple(manifest.input.shape), dtype=np.float32)}
        return (lambda: sess.run(None, batch)), 12
    if kind == "j2k":
        from pydicom.uid import JPEG2000Lossless

        from appliance.dicom import parse
        from appliance.tools import synthetic

        inst = parse(synthetic.to_dicom(synthetic.generate_slice(3, size=512),
                                        transfer_syntax=JPEG2000Lossless))
        return (lambda: inst.decode_frame_raw(0, raw=True)), 15
    raise SystemExit(f"unknown workload {kind!r}")


def _child(kind: str, core: int, start: Any, out: Any, index: int) -> None:
    os.sched_setaffinity(0, {core})
    fn, units = _work(kind)
    fn()  # warm
    start.wait()
    t0 = time.thread_time()
    for _ in range(units):
        fn()
    out.put((index, (time.thread_time() - t0) / units * 1000.0))


def _round(kind: str, cores: list[int], others: tuple[str, ...] = ()) -> list[float]:
    """Run ``kind`` on ``cores[0]`` and, on the other cores, ``others`` (default: ``kind`` again)."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    kinds = [kind, *(others or (kind,) * (len(cores) - 1))][: len(cores)]
    procs = [ctx.Process(target=_child, args=(k, c, start, out, i))
             for i, (k, c) in enumerate(zip(kinds, cores, strict=True))]
    for p in procs:
        p.start()
    time.sleep(4.0)  # every child loaded and warm before the start
    start.set()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    return [results[i] for i in range(len(procs))]


def main(argv: list[str]) -> int:
    rounds = int(argv[1]) if len(argv) > 1 else 3
    cores = sorted(os.sched_getaffinity(0))
    report: dict[str, dict[str, float]] = {}
    for kind in ("sgemm", "engine", "j2k"):
        alone, together = [], []
        for _ in range(rounds):  # alternate, so the box's drift hits both alike
            alone.extend(_round(kind, cores[:1]))
            together.extend(_round(kind, cores))
        a, t = statistics.median(alone), statistics.median(together)
        report[kind] = {"alone_ms": round(a, 3), "all_cores_ms": round(t, 3), "ratio": round(t / a, 3)}
        print(f"{kind:7s} one core alone {a:8.3f} ms   {len(cores)} cores busy {t:8.3f} ms   ratio {t / a:.3f}",
              flush=True)
    if len(cores) > 1:  # what the daemon does under load: the engine on one core, a decoder on the other
        alone, beside = [], []
        for _ in range(rounds):
            alone.extend(_round("engine", cores[:1]))
            beside.append(_round("engine", cores[:2], ("j2k",))[0])
        a, t = statistics.median(alone), statistics.median(beside)
        report["engine_beside_j2k"] = {"alone_ms": round(a, 3), "all_cores_ms": round(t, 3), "ratio": round(t / a, 3)}
        print(f"engine  one core alone {a:8.3f} ms   beside a J2K decoder {t:8.3f} ms   ratio {t / a:.3f}",
              flush=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
