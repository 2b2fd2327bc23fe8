"""What the worker process costs on top of its work: CPU and minor page faults per file, sequential, no load.

    python bench/worker_overhead.py [WORKLOAD=native] [REPS=10] [HEAP_KEEP_BYTES=64 MiB] [INPUT_BUFFER_BYTES=4 MiB]

Runs the same calls a worker makes (``dicom.parse`` + ``Pipeline.check`` + ``Pipeline.run`` into a slot) on 32
workload files in this process, then through a real worker process and its protocol (the file through the shared
input buffer, or the pipe with INPUT_BUFFER_BYTES 0; parse, last frame),
and prints CPU ms and minor faults per file for both. docs/performance.md ("Heap") quotes it.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time
from multiprocessing.reduction import send_handle
from pathlib import Path

import numpy as np

from appliance import dicom
from appliance.pipeline.loader import load_pipelines
from appliance.tools import benchcost, synthetic
from appliance.workers.arena import InputBuffer, SlotArena
from appliance.workers.child import WorkerSpec, worker_main

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    workload = argv[1] if len(argv) > 1 else "native"
    reps = int(argv[2]) if len(argv) > 2 else 10
    keep = int(argv[3]) if len(argv) > 3 else 64 << 20
    pipe_over = int(argv[4]) if len(argv) > 4 else 4 << 20  # [workers] input_buffer_bytes; 0: every file by pipe
    files = synthetic.workload(workload, 32, 0)
    pipeline = load_pipelines(REPO / "pipelines", REPO / "models")["ct-nodule"]
    slot = np.zeros(pipeline.input_shape, np.float32)
    n = reps * len(files)

    def local(data: bytes) -> None:
        inst = dicom.parse(data)
        pipeline.check(inst)
        pipeline.run(inst, 0, slot)

    for data in files:
        local(data)
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
    for _ in range(reps):
        for data in files:
            local(data)
    t_local = (time.thread_time() - t0) / n * 1000
    f_local = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / n

    arena = SlotArena.create(2, tuple(pipeline.input_shape))
    inputs = InputBuffer(pipe_over) if pipe_over else None  # the worker's input buffer, as in the daemon
    spec = WorkerSpec(arena=arena.spec, pipelines_dir=str(REPO / "pipelines"), models_dir=str(REPO / "models"),
                      model=pipeline.model, limits=dicom.DicomLimits(), memory_bytes=0, heap_keep_bytes=keep,
                      input_bytes=pipe_over)
    ctx = mp.get_context("forkserver")
    conn, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(child, spec))
    proc.start()
    child.close()
    if inputs is not None:
        send_handle(conn, inputs.fd, proc.pid or 0)
    assert conn.recv()[0] == "ready"
    job = 0

    def remote(data: bytes) -> None:
        nonlocal job
        job += 1
        if inputs is not None and len(data) <= pipe_over:
            inputs.bytes[: len(data)] = np.frombuffer(data, np.uint8)
            conn.send(("parse", job, pipeline.name, len(data)))
        else:
            conn.send(("parse", job, pipeline.name, -1))
            conn.send_bytes(data)
        assert conn.recv()[0] == "parsed"
        conn.send(("frame", job, 0, 0, True))  # the last frame: the worker forgets the instance after it
        assert conn.recv()[0] == "frame"

    try:
        for data in files:
            remote(data)
        pid = proc.pid or 0
        c0, m0, s0 = benchcost.proc_tree_cpu_s(pid)[pid], benchcost.proc_tree_minor_faults(pid), time.thread_time()
        for _ in range(reps):
            for data in files:
                remote(data)
        c1, m1 = benchcost.proc_tree_cpu_s(pid)[pid], benchcost.proc_tree_minor_faults(pid)
        t_send = (time.thread_time() - s0) / n * 1000
    finally:
        conn.send(("stop",))
        proc.join(5)
        arena.close()
        if inputs is not None:
            inputs.close()
    print(f"{workload}, heap_keep_bytes {keep}: in one process {t_local:.2f} ms/file, {f_local:.0f} faults/file; "
          f"worker process {(c1 - c0) / n * 1000:.2f} ms/file, {(m1 - m0) / n:.0f} faults/file; "
          f"daemon side (send + wait) {t_send:.2f} ms/file")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
