"""`doctor --gpu`'s GPU branch, run against the shipped fakes (CUDA runtime with a device, tensorrt, pynvml).

What it proves: the self-test's plumbing (build, compare with the CPU within the manifest tolerance, timing,
AUC, the W4A16-vs-FP16 line, the end-to-end daemon run with temperature samples) and its JSON. What it does
not prove: anything about a real GPU (the fake engine computes with ONNX Runtime on the CPU).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from appliance.config import load_config
from appliance.engines import fake_cudart, fake_tensorrt
from appliance.fakes.fake_pynvml import FakePynvml
from appliance.manifest import load_manifest
from appliance.tools.doctor_gpu import check_gpu

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "ct-nodule"


@pytest.fixture
def fakes():
    yield fake_cudart.reset(), fake_tensorrt.reset()
    fake_cudart.reset()
    fake_tensorrt.reset()


def test_gpu_self_test_on_fakes_reports_every_stage(fakes, tmp_path) -> None:
    manifest = load_manifest(MODEL_DIR / "model.toml")
    checks, no_gpu = check_gpu(load_config(None), manifest, cudart=fake_cudart, trt_module=fake_tensorrt,
                               nvml=FakePynvml(temperature=61), cache_dir=tmp_path, e2e_backend="onnxruntime-cpu",
                               slices=16, timing_runs=3, e2e_requests=24)
    assert not no_gpu
    by_name = {c.name: c for c in checks}
    assert by_name["gpu"].ok and "NVIDIA GeForce RTX 4090, compute capability 8.9" in by_name["gpu"].detail
    assert by_name["nvml"].ok and "61" in by_name["nvml"].detail
    assert by_name["tensorrt import"].ok and "10.13" in by_name["tensorrt import"].detail
    for precision in ("w4a16", "fp16"):
        check = by_name[f"tensorrt {precision}"]
        assert check.ok, check.detail
        assert check.data["max_abs_diff_vs_cpu"] <= check.data["tolerance"] == manifest.artifact(precision).tolerance
        assert check.data["auc"] == check.data["auc_cpu"]  # the fake computes exactly what ORT-CPU does
        assert check.data["plan"]["built"] and check.data["ms_per_batch_p50"] > 0
    assert fake_tensorrt.STATE.builds == 2
    assert "W4A16" in by_name["w4a16 vs fp16"].detail and "FP16" in by_name["w4a16 vs fp16"].detail
    assert not by_name["engine onnxruntime-cuda"].ok  # no real CUDA here: its own reason, not a crash
    e2e = by_name["end-to-end (daemon)"]
    assert e2e.ok, e2e.detail
    assert e2e.data["latency_ms"]["p50"] > 0 and e2e.data["latency_ms"]["p99"] >= e2e.data["latency_ms"]["p50"]
    assert e2e.data["gpu_temp_c"]["max"] == 61.0
    json.dumps([asdict(c) for c in checks], default=str)  # the bug-report JSON serialises


def test_gpu_self_test_flags_a_silent_fp32_build(fakes, tmp_path) -> None:
    fake_tensorrt.STATE.drop_int4 = True
    manifest = load_manifest(MODEL_DIR / "model.toml")
    checks, _ = check_gpu(load_config(None), manifest, e2e=False, cudart=fake_cudart, trt_module=fake_tensorrt,
                          nvml=FakePynvml(), cache_dir=tmp_path, slices=8, timing_runs=2)
    by_name = {c.name: c for c in checks}
    assert not by_name["tensorrt w4a16"].ok and "silent" in by_name["tensorrt w4a16"].detail
    assert by_name["tensorrt fp16"].ok
    assert "w4a16 vs fp16" not in by_name and "end-to-end (daemon)" not in by_name
