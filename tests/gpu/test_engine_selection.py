"""Backend selection: ``auto`` order and load-time fallback, honest reasons, the two-distribution guard.

Runs in both CI venvs: with the CPU wheel (``[cpu]``) and with onnxruntime-gpu (``[gpu]``, no CUDA libraries,
no driver), where the GPU providers are listed but cannot run: the reasons must say which library/driver.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from appliance.cli import main as cli_main
from appliance.engines import AUTO_ORDER, AutoEngine, backend_report, resolve
from appliance.engines.fake import FakeEngine
from appliance.engines.onnxruntime import OrtCudaEngine, check_distributions, probe_provider
from appliance.errors import BackendUnavailable, EngineError
from appliance.manifest import load_manifest

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "ct-nodule"
GPU_WHEEL = any(True for _ in importlib.metadata.distributions(name="onnxruntime-gpu"))


def test_auto_order_is_tensorrt_then_ort_trt_then_cuda_then_cpu() -> None:
    assert AUTO_ORDER == ("tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda", "onnxruntime-cpu")
    assert resolve("auto")[0] is AutoEngine


class _LoadsButFails(FakeEngine):
    name = "gpu-that-fails"

    def load(self) -> None:
        raise BackendUnavailable("CUDA EP could not place node X on the GPU")


class _Missing(FakeEngine):
    name = "missing"

    @classmethod
    def why_unavailable(cls) -> str | None:
        return "needs libnvinfer.so.10"


class _Works(FakeEngine):
    name = "works"
    closed: ClassVar[list[str]] = []


def test_auto_skips_unavailable_and_failing_backends_with_reasons(caplog) -> None:
    manifest = load_manifest(MODEL_DIR / "model.toml")
    engine = AutoEngine(manifest, manifest.artifact(), {
        "auto_order": ("missing", "fails", "works"),
        "auto_classes": {"missing": _Missing, "fails": _LoadsButFails, "works": _Works}})
    with caplog.at_level("WARNING"):
        engine.load()
    assert isinstance(engine.chosen, _Works) and engine.backend == "fake"
    assert engine.skipped == {"missing": "needs libnvinfer.so.10",
                              "fails": "failed to load: CUDA EP could not place node X on the GPU"}
    assert "engine backend fails skipped" in caplog.text
    out = engine.run(np.ones((8, 1, 256, 256), np.float32))
    assert out["prob"].shape == (8, 1)


@pytest.mark.parametrize("gpu", [True, False])
def test_auto_on_the_cpu_of_a_machine_with_a_gpu_says_so_loudly(gpu: bool, monkeypatch, caplog) -> None:
    """Ops review, session 14: a GPU box whose driver came up late fell back to the CPU with one WARNING per
    skipped backend and then ran at CPU speed for good; nothing in health said so."""
    import appliance.engines as engines

    monkeypatch.setattr(engines, "nvidia_device_present", lambda: gpu)
    manifest = load_manifest(MODEL_DIR / "model.toml")
    engine = AutoEngine(manifest, manifest.artifact(), {
        "auto_order": ("missing", "onnxruntime-cpu"), "auto_classes": {"missing": _Missing, "onnxruntime-cpu": _Works}})
    with caplog.at_level("WARNING"):
        engine.load()
    if gpu:
        assert engine.fallback == ("engine on the CPU although this machine has an NVIDIA GPU "
                                   "(missing: needs libnvinfer.so.10)")
        assert "restart the service once the GPU backend can load" in caplog.text
    else:
        assert engine.fallback is None and "although this machine has" not in caplog.text


def test_auto_with_nothing_usable_raises_every_reason() -> None:
    manifest = load_manifest(MODEL_DIR / "model.toml")
    engine = AutoEngine(manifest, manifest.artifact(), {"auto_order": ("missing",), "auto_classes": {
        "missing": _Missing}})
    with pytest.raises(BackendUnavailable, match="missing: needs libnvinfer.so.10"):
        engine.load()


def test_auto_on_this_cpu_box_serves_on_the_cpu_and_says_why_not_the_gpu() -> None:
    manifest = load_manifest(MODEL_DIR / "model.toml")
    engine = AutoEngine(manifest, manifest.artifact(), {})
    engine.load()
    if OrtCudaEngine.why_unavailable() is not None:  # no GPU here (CI): every GPU backend has its reason
        assert engine.backend == "onnxruntime:CPUExecutionProvider"
        assert set(engine.skipped) == {"tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda"}
        assert all(engine.skipped.values())
    engine.warmup(1)
    engine.close()


def test_named_gpu_backend_that_cannot_run_fails_with_its_reason() -> None:
    why = OrtCudaEngine.why_unavailable()
    if why is None:
        pytest.skip("CUDA works here")
    with pytest.raises(BackendUnavailable, match="onnxruntime-cuda"):
        resolve("onnxruntime-cuda")


def test_cuda_reason_is_true_to_this_machine() -> None:
    import onnxruntime as ort

    why = probe_provider("CUDAExecutionProvider")
    if "CUDAExecutionProvider" not in ort.get_available_providers():  # the CPU wheel
        assert "not in this build" in why and "onnxruntime-gpu" in why
        return
    if why is None:
        pytest.skip("CUDA works here")
    # onnxruntime-gpu without its CUDA libraries or without a driver: listed, but the reason says what is missing
    assert "cannot load" in why or "no NVIDIA driver" in why or "no CUDA GPU" in why


@pytest.mark.skipif(not GPU_WHEEL, reason="needs onnxruntime-gpu (the [gpu] extra venv)")
def test_gpu_wheel_without_libraries_names_the_missing_library_and_the_driver() -> None:
    why = probe_provider("CUDAExecutionProvider")
    if why is None:
        pytest.skip("CUDA works here")
    assert "libonnxruntime_providers_cuda.so cannot load: libcu" in why  # libcublasLt.so.13 / libcudart...
    trt = probe_provider("TensorrtExecutionProvider")
    assert "libonnxruntime_providers_tensorrt.so cannot load" in trt


@pytest.mark.skipif(not GPU_WHEEL, reason="needs onnxruntime-gpu (the [gpu] extra venv)")
def test_silent_cpu_fallback_of_the_real_gpu_wheel_is_detected() -> None:
    """Without disable_cpu_ep_fallback, onnxruntime-gpu silently runs a CUDA session on the CPU here."""
    import onnxruntime as ort

    from appliance.engines.onnxruntime import PROBE_GRAPH

    if probe_provider("CUDAExecutionProvider") is None:
        pytest.skip("CUDA works here")
    so = ort.SessionOptions()
    so.log_severity_level = 4
    silent = ort.InferenceSession(str(PROBE_GRAPH), so, providers=["CUDAExecutionProvider"])
    assert silent.get_providers() == ["CPUExecutionProvider"]  # the trap
    manifest = load_manifest(MODEL_DIR / "model.toml")
    with pytest.raises(BackendUnavailable, match="CUDAExecutionProvider"):
        OrtCudaEngine(manifest, manifest.artifact(), {}).load()


def test_both_onnxruntime_distributions_are_refused(tmp_path, monkeypatch) -> None:
    installed = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
    other = "onnxruntime" if "onnxruntime-gpu" in installed else "onnxruntime-gpu"
    dist = tmp_path / f"{other.replace('-', '_')}-1.99.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {other}\nVersion: 1.99.0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    why = check_distributions()
    assert why is not None and "both installed" in why and "1.99.0" in why
    with pytest.raises(BackendUnavailable, match="both installed"):
        resolve("auto")


def test_backends_json_lists_every_backend_with_a_reason_or_none(capsys) -> None:
    assert cli_main(["backends", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    engines = report["engines"]
    assert set(engines) >= {"tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda", "onnxruntime-cpu"}
    assert engines["onnxruntime-cpu"]["available"] is True
    for name in ("tensorrt", "onnxruntime-cuda"):
        entry = engines[name]
        assert entry["available"] is (entry["reason"] is None)
    assert engines == {k: {"available": v is None, "reason": v, "needs": engines[k]["needs"]}
                       for k, v in backend_report().items() if k != "fake"}


def _provider_strings(short: str) -> set[str]:
    import re

    import onnxruntime as ort

    lib = Path(ort.__file__).parent / "capi" / f"libonnxruntime_providers_{short}.so"
    return {m.decode() for m in re.findall(rb"[A-Za-z_][A-Za-z0-9_]{2,80}(?=\0)", lib.read_bytes())}


@pytest.mark.skipif(not GPU_WHEEL, reason="needs onnxruntime-gpu (the [gpu] extra venv)")
def test_provider_option_names_exist_in_the_real_provider_libraries(tmp_path) -> None:
    from appliance.engines.onnxruntime import OrtTensorrtEngine

    manifest = load_manifest(MODEL_DIR / "model.toml")
    (cuda_name, cuda_opts), = OrtCudaEngine(manifest, manifest.artifact(), {"gpu_mem_limit": 1 << 30})._providers()
    trt_engine = OrtTensorrtEngine(manifest, manifest.artifact(), {"cache_dir": tmp_path})
    (trt_name, trt_opts), (_, _) = trt_engine._providers()
    cuda_names, trt_names = _provider_strings("cuda"), _provider_strings("tensorrt")
    assert "NoSuchProviderOption" not in cuda_names
    assert set(cuda_opts) <= cuda_names and {"HEURISTIC", "kSameAsRequested"} <= cuda_names
    assert set(trt_opts) <= trt_names, sorted(set(trt_opts) - trt_names)
    assert (cuda_name, trt_name) == ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def test_daemon_with_auto_serves_on_the_cpu_here_and_logs_why_not_the_gpu(tmp_path) -> None:
    """The issue's trap: with [gpu] and no GPU, `serve` used to refuse ("fallback to CPU EP ... disabled")."""
    from appliance.tools.bench import _Daemon

    if OrtCudaEngine.why_unavailable() is None:
        pytest.skip("CUDA works here")
    daemon = _Daemon(["--backend", "auto"], tmp_path / "daemon.log")
    try:
        daemon.wait_serving(timeout_s=120)
    finally:
        daemon.stop()
    log = (tmp_path / "daemon.log").read_text()
    assert "engine backend onnxruntime-cuda skipped: " in log
    assert log.count("engine backend tensorrt skipped: ") == 1  # once: it was logged again at start (ops review 18)
    assert "engine backend auto -> onnxruntime-cpu" in log
    assert "fallback to CPU EP has been explicitly disabled" not in log


def test_default_submit_result_is_synchronous_depth_one_and_auto_delegates() -> None:
    manifest = load_manifest(MODEL_DIR / "model.toml")
    engine = AutoEngine(manifest, manifest.artifact(), {"auto_order": ("works",), "auto_classes": {"works": _Works}})
    engine.load()
    assert engine.max_in_flight == 1
    x = np.full((8, 1, 256, 256), 0.25, np.float32)
    ticket = engine.submit(x)
    with pytest.raises(EngineError, match="already in flight"):
        engine.submit(x)
    assert float(engine.result(ticket)["prob"][0, 0]) == pytest.approx(0.25)
    with pytest.raises(EngineError, match="not submitted"):
        engine.result(ticket)
