"""Summarise a ``py-spy record --format raw --subprocesses --threads`` profile of the daemon.

Prints where the active (non-idle) samples went: by process (daemon, worker, fork server), by thread, and by
stage (engine, decode, parse, preprocessing kernels, gRPC, protobuf, worker IPC, batcher, request path, event
loop, ...), as CPU seconds and, given the bench report next to it, as CPU ms per answered request.

Usage: python bench/profile_summary.py out/profile/daemon.txt [RATE_HZ] [SECONDS] [out/profile/bench.json]
(SECONDS: the sampling window; requests in it = the bench's throughput x SECONDS.)
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

# First match wins, checked against the whole stack (outermost first), so the most specific stage comes first.
STAGES = [
    ("engine (ONNX Runtime run)", ("onnxruntime_inference_collection", "engines/onnxruntime.py")),
    ("decode (pixel data)", ("pydicom/pixels/", "openjpeg", "jpeg_ls", "rle/", "libjpeg", "decode_frame_raw")),
    ("parse + validate (pydicom, codestream)", ("filereader.py", "dicom.py", "codestream.py", "dataset.py")),
    ("preprocess kernels (window, resize)", ("preprocess.py",)),
    ("worker IPC (pipes, pickle)", ("multiprocessing/connection.py", "workers/pool.py", "workers/child.py")),
    ("slot arena", ("workers/arena.py",)),
    ("protobuf", ("protobuf", "_pb2", "SerializeToString", "FromString")),
    ("batcher / pacer", ("batcher.py", "pacer.py")),
    ("postprocess", ("postprocess.py",)),
    ("request path (analyze, server)", ("analyze.py", "server.py")),
    ("gRPC", ("grpc/", "grpc_", "_cython")),
    ("asyncio event loop", ("asyncio/",)),
    ("threads / queues", ("threading.py", "queue.py", "concurrent/futures")),
]


def stage_of(frames: list[str]) -> str:
    text = ";".join(frames)
    for name, markers in STAGES:
        if any(m in text for m in markers):
            return name
    leaf = frames[-1] if frames else "?"
    m = re.search(r"\(([^:)]+)", leaf)
    return f"other ({m.group(1) if m else leaf})"


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    rate = float(argv[2]) if len(argv) > 2 else 100.0
    window = float(argv[3]) if len(argv) > 3 else 0.0
    bench = Path(argv[4]) if len(argv) > 4 else path.with_name("bench.json")
    answered = 0.0
    if bench.exists() and window > 0:
        report = json.loads(bench.read_text())
        answered = float(report.get("throughput_per_s", 0.0)) * window
    by_proc: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    by_stage: collections.Counter[str] = collections.Counter()
    by_proc_stage: collections.Counter[tuple[str, str]] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    root = None
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        procs = [p for p in parts if p.startswith("process ")]
        pid = procs[-1].split(":", 1)[0].split()[1] if procs else "?"
        root = root or (procs[0].split(":", 1)[0].split()[1] if procs else "?")
        role = "daemon" if len(procs) <= 1 else ("fork server" if len(procs) == 2 else "worker")
        thread = next((p.split(": ", 1)[1] for p in parts if p.startswith("thread (")), "?")
        frames = [p for p in parts if not p.startswith(("process ", "thread ("))]
        stage = stage_of(frames)
        total += n
        by_proc[f"{role} {pid}"] += n
        by_thread[f"{role}/{thread}"] += n
        by_stage[stage] += n
        by_proc_stage[(role, stage)] += n
        leaves[frames[-1] if frames else "?"] += n

    def show(title: str, counter: collections.Counter, top: int = 20) -> None:
        print(f"\n{title}")
        for key, n in counter.most_common(top):
            label = " / ".join(key) if isinstance(key, tuple) else key
            per_req = f"{n / rate * 1000.0 / answered:7.2f} ms/req" if answered else ""
            print(f"  {n / rate:7.2f} s  {100.0 * n / total:5.1f} %  {per_req}  {label}")

    print(f"{path}: {total} active samples at {rate:g} Hz = {total / rate:.2f} CPU s"
          + (f"; ~{answered:.0f} requests answered in the {window:g} s window" if answered else ""))
    show("by process", by_proc)
    show("by thread", by_thread)
    show("by stage", by_stage)
    show("by process and stage", by_proc_stage, 30)
    show("hottest leaf frames", leaves, 15)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
