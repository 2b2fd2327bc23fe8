"""``appliance doctor --gpu``: the self-test for an RTX box (docs/gpu.md, "Reading the self-test").

In order: the environment (package versions: what a bug report needs), the CUDA driver and device through
cuda-bindings, NVML, the TensorRT and cuda-bindings imports; then, per GPU artifact (W4A16 and FP16), build
or load the TensorRT plan, compare its outputs with ONNX Runtime on the CPU running the same artifact (bound:
the manifest's ``tolerance``), time it per batch and measure its AUC on a small synthetic set next to the
CPU's; the ONNX Runtime CUDA backend the same way; finally end-to-end p50/p99 through a real daemon
(``appliance serve --backend tensorrt`` on loopback) while NVML samples the GPU temperature.

Without a usable NVIDIA GPU it says so in the first check and ``run_doctor`` exits with
:data:`EXIT_NO_GPU`; the other checks still show which packages and libraries are there.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform
import threading
import time
from typing import Any

import numpy as np

__all__ = ["EXIT_NO_GPU", "check_gpu"]

#: ``appliance doctor --gpu`` exit status when this machine has no usable NVIDIA GPU (driver or device).
EXIT_NO_GPU = 3

_DISTS = ("edge-appliance", "onnxruntime", "onnxruntime-gpu", "cuda-bindings", "nvidia-cuda-runtime",
          "tensorrt", "tensorrt-cu13", "tensorrt-cu13-bindings", "tensorrt-cu12", "nvidia-ml-py", "numpy")


def _check(name: str, ok: bool, detail: str, data: dict[str, Any] | None = None) -> Any:
    from appliance.tools.doctor import Check

    return Check(name, ok, detail, data)


def _environment() -> Any:
    versions: dict[str, str | None] = {}
    for dist in _DISTS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    data = {"python": platform.python_version(), "platform": platform.platform(), "packages": versions}
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    return _check("environment", True, shown, data)


def _slices(manifest: Any, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from appliance.tools import synthetic

    truths = [synthetic.generate_slice(seed + i, nodule=bool(i % 2), size=512) for i in range(n)]
    x = np.stack([synthetic.model_input(t, manifest) for t in truths]).astype(np.float32)
    return x, np.array([t.has_nodule for t in truths])


def _predict(engine: Any, x: np.ndarray) -> np.ndarray:
    b = engine.batch_size
    probs = []
    for k in range(0, len(x), b):
        chunk = x[k:k + b]
        n = len(chunk)
        if n < b:
            chunk = np.concatenate([chunk, np.zeros((b - n, *chunk.shape[1:]), np.float32)])
        probs.append(engine.run(chunk)["prob"][:n, 0])
    return np.concatenate(probs)


def _time(engine: Any, batch: np.ndarray, runs: int = 50) -> dict[str, float]:
    for _ in range(5):
        engine.run(batch)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        engine.run(batch)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms_per_batch_p50": round(float(np.median(times)), 3),
            "ms_per_batch_p99": round(float(np.percentile(times, 99)), 3)}


def _engine_check(name: str, engine: Any, manifest: Any, precision: str, x: np.ndarray,
                  labels: np.ndarray, timing_runs: int = 50) -> tuple[Any, dict[str, Any]]:
    """Load ``engine``, compare with ORT-CPU on the same artifact, time it, AUC on (x, labels)."""
    from appliance.engines.onnxruntime import OrtCpuEngine
    from appliance.errors import ApplianceError
    from appliance.modelbuild.evaluate import auc

    artifact = manifest.artifact(precision)
    try:
        t0 = time.monotonic()
        engine.load()
        load_s = round(time.monotonic() - t0, 2)
        engine.warmup(2)
        cpu = OrtCpuEngine(manifest, artifact, {"intra_op_threads": 1})
        cpu.load()
        batch = x[: manifest.input.batch_size]
        ref, got = cpu.run(batch), engine.run(batch)
        diff = max(float(np.max(np.abs(ref[k] - got[k]))) for k in ref)
        data: dict[str, Any] = {"backend": engine.backend, "precision": precision, "load_s": load_s,
                                "max_abs_diff_vs_cpu": diff, "tolerance": artifact.tolerance,
                                **_time(engine, batch, timing_runs)}
        data["auc"] = round(auc(_predict(engine, x), labels), 4)
        data["auc_cpu"] = round(auc(_predict(cpu, x), labels), 4)
        data["n_slices"] = len(x)
        if hasattr(engine, "build_report"):
            data["plan"] = engine.build_report
        ok = diff <= artifact.tolerance
        detail = (f"{engine.backend} {precision}: {data['ms_per_batch_p50']:.2f} ms/batch p50 "
                  f"({data['ms_per_batch_p99']:.2f} p99), AUC {data['auc']} (CPU {data['auc_cpu']}, n={len(x)}), "
                  f"max |GPU - CPU| {diff:.4g} {'<=' if ok else '>'} tolerance {artifact.tolerance}")
        return _check(name, ok, detail, data), data
    except ApplianceError as e:
        return _check(name, False, f"{precision}: {e}"), {}
    finally:
        engine.close()


def _end_to_end(nvml: Any, backend: str = "tensorrt", requests: int = 200) -> Any:
    """p50/p99 through ``appliance serve --backend <backend>`` on loopback, GPU temperature sampled meanwhile."""
    import tempfile
    from pathlib import Path

    from appliance.tools import synthetic
    from appliance.tools.bench import _Daemon, run_load

    temps: list[float] = []
    stop = threading.Event()

    def sample() -> None:  # at the start, every 0.5 s, and once more at the end: a short run still has readings
        while True:
            reading = nvml.read()
            if reading.temp_c is not None:
                temps.append(float(reading.temp_c))
            if stop.wait(0.5):
                return

    files = synthetic.workload("mixed", min(32, requests), 7)
    with tempfile.TemporaryDirectory(prefix="appliance-doctor-") as tmp:
        daemon = _Daemon(["--backend", backend], Path(tmp) / "daemon.log")
        try:
            daemon.wait_serving(timeout_s=900)
            asyncio.run(run_load(daemon.target, files, concurrency=16, duration_s=None, requests=min(32, requests)))
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            report = asyncio.run(run_load(daemon.target, files, concurrency=16, duration_s=None,
                                          requests=requests))
        except (RuntimeError, TimeoutError) as e:
            return _check("end-to-end (daemon)", False, f"the daemon did not serve on {backend}: {e}")
        finally:
            stop.set()
            daemon.stop()
        sampler.join(2.0)
    lat = report.get("latency_ms", {})
    data = {"backend": backend, "latency_ms": lat, "throughput_per_s": report.get("throughput_per_s"),
            "errors": report.get("errors"),
            "gpu_temp_c": {"max": max(temps) if temps else None,
                           "mean": round(float(np.mean(temps)), 1) if temps else None, "samples": len(temps)}}
    ok = not report.get("errors")
    return _check("end-to-end (daemon)", ok,
                  f"p50 {lat.get('p50')} ms, p99 {lat.get('p99')} ms, {report.get('throughput_per_s')} slices/s, "
                  f"GPU {data['gpu_temp_c']['max']} °C max during the run", data)


def check_gpu(config: Any, manifest: Any, *, e2e: bool = True, cudart: Any = None, trt_module: Any = None,
              nvml: Any = None, cache_dir: Any = None, e2e_backend: str = "tensorrt", slices: int = 64,
              timing_runs: int = 50, e2e_requests: int = 200) -> tuple[list[Any], bool]:
    """Run the GPU self-test; return (checks, no_gpu).

    ``cudart``, ``trt_module`` and ``nvml`` (a ``pynvml``-like module) default to the real libraries; tests
    pass the shipped fakes. ``e2e_backend`` is the backend of the end-to-end daemon run; ``slices``,
    ``timing_runs`` and ``e2e_requests`` size the AUC set, the per-batch timing and the daemon run.
    """
    from appliance.engines.cuda import probe_device
    from appliance.engines.onnxruntime import OrtCudaEngine
    from appliance.engines.tensorrt import TensorrtEngine
    from appliance.engines.trt_build import import_tensorrt, version_problem
    from appliance.thermometers import NvmlThermometer

    checks = [_environment()]
    device = probe_device(cudart)
    if not device.ok:
        checks.append(_check("gpu", False, f"NO USABLE NVIDIA GPU on this machine: {device.reason}",
                             device.as_dict()))
    else:
        cc, memory = device.compute_capability, device.total_memory_bytes
        assert cc is not None and memory is not None  # device.ok: the properties were read
        checks.append(_check("gpu", True, f"{device.name}, compute capability {cc[0]}.{cc[1]}, "
                                          f"{memory / 2**30:.1f} GiB, CUDA driver "
                                          f"{device.driver_version}, runtime {device.runtime_version}",
                             device.as_dict()))
    nvml = NvmlThermometer(nvml=nvml)
    if nvml.available:
        pynvml = nvml.nvml
        checks.append(_check("nvml", True, f"{pynvml.nvmlDeviceGetName(nvml.handle)}, driver "
                                           f"{pynvml.nvmlSystemGetDriverVersion()}, {nvml.read().temp_c} °C"))
    else:
        checks.append(_check("nvml", False, nvml.why_unavailable))
    try:
        trt = trt_module or import_tensorrt()
        problem = version_problem(trt.__version__)
        checks.append(_check("tensorrt import", problem is None, problem or f"tensorrt {trt.__version__}"))
    except ImportError as e:
        checks.append(_check("tensorrt import", False, str(e)))
    if not device.ok or manifest is None:
        nvml.close()
        return checks, not device.ok
    x, labels = _slices(manifest, slices, 9000)
    results = {}
    for precision in ("w4a16", "fp16"):
        if precision not in manifest.artifacts:
            continue
        options = {"precision": precision, "trt_module": trt_module, "cudart": cudart, "cache_dir": cache_dir}
        engine = TensorrtEngine(manifest, manifest.artifact(precision), {k: v for k, v in options.items() if v})
        check, results[precision] = _engine_check(f"tensorrt {precision}", engine, manifest, precision, x, labels,
                                                  timing_runs)
        checks.append(check)
    if len(results) == 2 and all(results.values()):
        w, f = results["w4a16"], results["fp16"]
        checks.append(_check("w4a16 vs fp16", True,
                             f"W4A16 {w['ms_per_batch_p50']} ms/batch AUC {w['auc']} | FP16 {f['ms_per_batch_p50']} "
                             f"ms/batch AUC {f['auc']} (B={manifest.input.batch_size}, same GPU, same slices)",
                             {"w4a16": w, "fp16": f}))
    why = OrtCudaEngine.why_unavailable()
    if why is not None:
        checks.append(_check("engine onnxruntime-cuda", False, why))
    else:
        precision = config.model.precision or manifest.default_precision
        ort_engine = OrtCudaEngine(manifest, manifest.artifact(precision), {})
        checks.append(_engine_check("engine onnxruntime-cuda", ort_engine, manifest, precision, x, labels,
                                    timing_runs)[0])
    if e2e and results.get("w4a16"):
        checks.append(_end_to_end(nvml, e2e_backend, e2e_requests))
    nvml.close()
    return checks, False
