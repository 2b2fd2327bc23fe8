"""Stage costs for ``appliance bench``: what each slice costs on one core, and the machine's ceiling from it.

Measured in the bench process, on one pinned core, while no server is loaded, as the calling thread's CPU time
(``time.thread_time``), so waiting for a core on a shared machine does not inflate them:

* :func:`preprocess_costs`: bytes -> ready batch slot (``dicom.parse`` + ``Pipeline.check`` + ``Pipeline.run``
  into a preallocated slot), median ms per file, by transfer syntax;
* :func:`engine_cost`: ONNX Runtime CPU with the daemon's session settings and one intra-op thread, median
  ms per full batch of B;
* :func:`model_flops`: multiply-adds x 2 of the ONNX graph's Conv/MatMul/Gemm nodes per batch (shape
  inference on the graph);
* :func:`sgemm_gflops`: single-thread float32 GEMM through numpy's BLAS (``threadpoolctl`` limit 1), the
  "what one core can do" reference for ``engine_flops_ratio``.

:func:`proc_tree_cpu_s` reads ``/proc/<pid>/stat`` of a server process and all its descendants (worker
processes, Triton's server and stubs), so CPU per answered request covers every process a server uses.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ceilings",
    "cpu_delta_s",
    "engine_cost",
    "inputs_digest",
    "model_flops",
    "pinned",
    "preprocess_costs",
    "proc_tree_cpu_s",
    "proc_tree_switches",
    "python_thread_names",
    "thread_cpu_s",
    "sgemm_gflops",
]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@contextlib.contextmanager
def pinned(cpu: int | None = None) -> Iterator[int]:
    """Pin this process to one CPU (the last one allowed, by default) for the block; yield the CPU."""
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed) if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, allowed)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from one snapshot of /proc."""
    kids = _children()
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _cpu_s(stat: str) -> float:
    """User + system CPU seconds from a /proc stat line (fields 14 and 15)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def proc_tree_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds of ``pid`` and each live descendant, by pid (0 for a vanished process)."""
    out: dict[int, float] = {}
    for p in _tree(pid):
        try:
            out[p] = _cpu_s(Path(f"/proc/{p}/stat").read_text())
        except OSError:
            out[p] = 0.0
    return out


def proc_tree_minor_faults(pid: int) -> int:
    """Minor page faults (fresh pages touched) of ``pid`` and its live descendants (/proc stat field 10)."""
    total = 0
    for p in _tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        total += int(stat[stat.rindex(")") + 2:].split()[7])
    return total


def proc_tree_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` and its descendants (wake-ups)."""
    total = 0
    for p in _tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                text = Path(f"/proc/{p}/task/{tid}/status").read_text()
            except OSError:
                continue
            for line in text.splitlines():
                if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                    total += int(line.split()[1])
    return total


def python_thread_names(pid: int) -> dict[str, str]:
    """Thread id -> Python thread name for ``pid`` and its descendants, from ``py-spy dump`` ({} without py-spy).

    The kernel names every Python thread "python"; py-spy reads the interpreter's own names ("engine",
    "MainThread", ...), so per-thread CPU can say which stage spent it.
    """
    import re
    import shutil
    import subprocess
    import sys

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return {}
    names: dict[str, str] = {}
    for p in _tree(pid):
        try:
            text = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(p)], capture_output=True, text=True,
                                  timeout=20, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        names.update({m.group(1): m.group(2) for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', text, re.M)})
    return names


def thread_cpu_s(pid: int, names: dict[str, str] | None = None) -> dict[str, float]:
    """CPU seconds by ``process-name[pid]/thread-name`` over ``pid`` and its descendants (same names summed).

    ``names`` (from :func:`python_thread_names`) replaces the kernel's thread names where it has the thread.
    ``process-name[pid]/(exited threads)`` holds the CPU of the process's threads that have ended (a JPEG 2000
    decoder's thread pool lives for one frame): the process's own counters include them, its live threads' do not.
    """
    names = names or {}
    out: dict[str, float] = {}
    for p in _tree(pid):
        try:
            pname = Path(f"/proc/{p}/comm").read_text().strip()
            tids = os.listdir(f"/proc/{p}/task")
            process_s = _cpu_s(Path(f"/proc/{p}/stat").read_text())
        except OSError:
            continue
        live_s = 0.0
        for tid in tids:
            try:
                stat = Path(f"/proc/{p}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = names.get(tid) or stat[stat.index("(") + 1:stat.rindex(")")]
            key = f"{pname}[{p}]/{name}"
            cpu_s = _cpu_s(stat)
            out[key] = out.get(key, 0.0) + cpu_s
            live_s += cpu_s
        out[f"{pname}[{p}]/(exited threads)"] = max(0.0, process_s - live_s)
    return out


def cpu_delta_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two :func:`proc_tree_cpu_s` readings (new processes count from zero)."""
    return sum(max(0.0, t - before.get(p, 0.0)) for p, t in after.items())


def _median_ms(fn: Any, reps: int) -> float:
    """Median CPU ms of this thread per call: a shared machine's waits for a core do not count.

    Every measured call runs on the calling thread (ONNX Runtime with one intra-op thread, BLAS limited to one
    thread, the decoders), so the thread's CPU clock is the cost.
    """
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1000.0)
    return statistics.median(times)


def preprocess_costs(files: list[bytes], pipeline: Any, reps: int = 3) -> dict[str, Any]:
    """Median ms per file from bytes to a ready slot, per transfer syntax and over the whole list.

    ``per_file_ms`` keeps the order of ``files`` (for the single-client bound of each request).
    """
    from appliance.dicom import parse
    from appliance.dicom.openjpeg import set_decoder_threads

    set_decoder_threads(1)  # thread CPU time counts the calling thread only: every decode runs on it
    slot = np.zeros(pipeline.input_shape, dtype=np.float32)
    per_file: list[float] = []
    by_syntax: dict[str, list[float]] = {}
    for data in files:
        inst = parse(data)

        def one(data: bytes = data) -> None:
            inst = parse(data)
            pipeline.check(inst)
            pipeline.run(inst, 0, slot)

        one()  # warm the decoder
        ms = _median_ms(one, reps)
        per_file.append(ms)
        by_syntax.setdefault(_syntax_name(inst.transfer_syntax_uid), []).append(ms)
    return {
        "per_file_ms": [round(x, 3) for x in per_file],
        "mean_ms": round(float(np.mean(per_file)), 3),
        "median_ms": round(float(np.median(per_file)), 3),
        "by_syntax_ms": {k: round(statistics.median(v), 3) for k, v in sorted(by_syntax.items())},
    }


def inputs_digest(files: list[bytes], pipeline: Any) -> str:
    """sha256 over the float32 model inputs ``pipeline`` computes for ``files``, in order."""
    import hashlib

    from appliance.dicom import parse

    digest = hashlib.sha256()
    slot = np.zeros(pipeline.input_shape, dtype=np.float32)
    for data in files:
        inst = parse(data)
        pipeline.check(inst)
        pipeline.run(inst, 0, slot)
        digest.update(slot.tobytes())
    return digest.hexdigest()


def _syntax_name(uid: str) -> str:
    from pydicom.uid import UID

    return UID(uid).name


def _session(manifest: Any, precision: str | None, threads: int) -> Any:
    import onnxruntime as ort

    art = manifest.artifact(precision)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    for key, value in art.session_config.items():
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(str(art.path), sess_options=so, providers=["CPUExecutionProvider"])


def engine_cost(manifest: Any, precision: str | None = None, runs: int = 15, threads: int = 1) -> float:
    """Median ms of one full batch (B from the manifest) on ONNX Runtime CPU, after 3 warm-up runs."""
    sess = _session(manifest, precision, threads)
    rng = np.random.default_rng(0)
    batch = {manifest.input.name: rng.random(tuple(manifest.input.shape), dtype=np.float32)}
    for _ in range(3):
        sess.run(None, batch)
    return _median_ms(lambda: sess.run(None, batch), runs)


def model_flops(path: Path) -> float:
    """FLOPs (2 x multiply-adds) of one run of the graph: Conv, MatMul and Gemm nodes, static shapes."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    g = model.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    for init in g.initializer:
        shapes[init.name] = tuple(numpy_helper.to_array(init).shape)
    total = 0.0
    for node in g.node:
        out = shapes.get(node.output[0])
        if out is None:
            continue
        if node.op_type == "Conv":
            w = shapes[node.input[1]]  # (Cout, Cin/groups, kh, kw)
            total += 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
        elif node.op_type in ("MatMul", "Gemm"):
            a = shapes.get(node.input[0])
            if a is None:
                continue
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if trans_a else a[-1]
            total += 2.0 * float(np.prod(out)) * float(k)
    return total


def sgemm_gflops(n: int = 1024, runs: int = 7) -> float:
    """Single-thread float32 GEMM GFLOP/s (n x n x n) through numpy's BLAS, best of ``runs``."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(1)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    with threadpool_limits(limits=1):
        np.matmul(a, b, out=c)
        best = min(_median_ms(lambda: np.matmul(a, b, out=c), 1) for _ in range(runs))  # CPU ms, one thread
    return 2.0 * n**3 / (best / 1000.0) / 1e9


def ceilings(pre_ms: float, engine_batch_ms: float, batch: int, cores: int, workers: int) -> dict[str, float]:
    """The throughput bounds (slices/s) from per-slice CPU costs.

    * ``cpu_ceiling``: every core busy with useful work: ``cores / (t_pre + t_engine(B) / B)``;
    * ``pipelined_bound``: the engine runs back to back while ``workers`` cores preprocess:
      ``B / max(t_engine(B), B * t_pre / workers)``;
    * ``bound``: the smaller of the two (what a perfect overlap on this machine reaches).
    """
    per_slice = pre_ms + engine_batch_ms / batch
    cpu = cores * 1000.0 / per_slice
    pipelined = batch * 1000.0 / max(engine_batch_ms, batch * pre_ms / max(workers, 1))
    return {
        "per_slice_cpu_ms": round(per_slice, 3),
        "cpu_ceiling_per_s": round(cpu, 2),
        "pipelined_bound_per_s": round(pipelined, 2),
        "bound_per_s": round(min(cpu, pipelined), 2),
    }
