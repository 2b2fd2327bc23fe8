"""The TensorRT backend's logic against the shipped fakes of ``tensorrt`` and the CUDA runtime.

Build, cache hit/miss/invalidation, I/O and precision checks, error paths, buffer rotation with overlap,
CUDA-graph capture and replay. The fake engine computes with ONNX Runtime on the CPU, so its outputs must
equal ORT-CPU's on the same artifact. (The real thing runs only on a GPU: `appliance doctor --gpu`.)
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from appliance.engines import fake_cudart, fake_tensorrt
from appliance.engines.onnxruntime import OrtCpuEngine
from appliance.engines.tensorrt import TensorrtEngine
from appliance.engines.trt_build import EXTEND_EVERY_S, ensure_plan
from appliance.errors import BackendUnavailable, EngineError
from appliance.manifest import Manifest, load_manifest
from appliance.modelbuild.manifest_writer import dumps
from appliance.serving.notify import RecordingNotifier

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "ct-nodule"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(MODEL_DIR / "model.toml")


@pytest.fixture(autouse=True)
def fakes():
    yield fake_cudart.reset(), fake_tensorrt.reset()
    fake_cudart.reset()
    fake_tensorrt.reset()


@pytest.fixture(scope="module")
def batch() -> np.ndarray:
    return np.random.default_rng(7).random((8, 1, 256, 256), dtype=np.float32)


@pytest.fixture(scope="module")
def reference(manifest: Manifest, batch: np.ndarray) -> dict[str, np.ndarray]:
    cpu = OrtCpuEngine(manifest, manifest.artifact("w4a16"))
    cpu.load()
    return cpu.run(batch)


def make(manifest: Manifest, cache: Path, **options) -> TensorrtEngine:
    return TensorrtEngine(manifest, manifest.artifact(), {"trt_module": fake_tensorrt, "cudart": fake_cudart,
                                                          "cache_dir": cache, **options})


def test_first_load_builds_strongly_typed_with_workspace_timing_cache_progress_and_notify(manifest, tmp_path):
    notifier, progress = RecordingNotifier(), []
    engine = make(manifest, tmp_path, notifier=notifier, workspace_bytes=1 << 30,
                  progress=lambda *a: progress.append(a))
    engine.load()
    assert engine.precision == "w4a16" and engine.build_report["built"]
    assert engine.build_report["reason"] == "no cached plan"
    cfg = fake_tensorrt.STATE.configs[-1]
    assert cfg == {"workspace": 1 << 30, "opt_level": 3, "detailed": True, "timing_cache": True,
                   "strongly_typed": True}
    assert progress[0] == ("Building engine", 0, 3) and progress[-1] == ("Building engine", 3, 3)
    assert f"EXTEND_TIMEOUT_USEC={int(3 * EXTEND_EVERY_S * 1e6)}" in notifier.messages
    assert any(m.startswith("STATUS=building TensorRT engine ct-nodule w4a16") for m in notifier.messages)
    plan = Path(engine.build_report["plan"])
    sidecar = json.loads(plan.with_suffix(".json").read_text())
    assert sidecar["key"]["onnx_sha256"] == manifest.artifact("w4a16").sha256
    assert sidecar["key"]["gpu_name"] == "NVIDIA GeForce RTX 4090" and sidecar["key"]["compute_capability"] == "8.9"
    assert sidecar["key"]["input_shape"] == [8, 1, 256, 256]
    assert sidecar["inspector_counts"]["int4"] > 0
    assert len(list(tmp_path.glob("timing-*.cache"))) == 1
    engine.close()


def test_cache_hit_then_invalidation_by_gpu_trt_version_and_artifact(manifest, tmp_path, monkeypatch):
    make(manifest, tmp_path).load()
    second = make(manifest, tmp_path)
    second.load()
    assert fake_tensorrt.STATE.builds == 1 and not second.build_report["built"]
    fake_cudart.STATE.prop = fake_cudart.cudaDeviceProp(name=b"NVIDIA GeForce RTX 3090", major=8, minor=6)
    make(manifest, tmp_path).load()
    assert fake_tensorrt.STATE.builds == 2  # another GPU: another key
    monkeypatch.setattr(fake_tensorrt, "__version__", "10.14.1.48")
    other = make(manifest, tmp_path)
    other.load()
    assert fake_tensorrt.STATE.builds == 3 and other.build_report["reason"] == "no cached plan"
    fp16 = make(manifest, tmp_path, precision="fp16")
    fp16.load()
    assert fake_tensorrt.STATE.builds == 4 and fp16.precision == "fp16"
    assert len(list(tmp_path.glob("*.plan"))) == 4


def test_batch_size_is_part_of_the_key(manifest, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(MODEL_DIR, copy)
    data = tomllib.loads((copy / "model.toml").read_text())
    for table in (data["input"], *data["outputs"]):
        assert table["shape"][0] == 8
        table["shape"][0] = 4
    (copy / "model.toml").write_text(dumps(data))
    small = load_manifest(copy / "model.toml")
    cache = tmp_path / "cache"
    make(manifest, cache).load()
    engine = make(small, cache)
    with pytest.raises(BackendUnavailable, match="does not match the manifest"):
        engine.load()  # a new key, a rebuild, and the B=8 graph does not match B=4
    assert fake_tensorrt.STATE.builds == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "sidecar", "foreign"])
def test_stale_or_corrupt_plans_are_rebuilt_never_trusted(manifest, tmp_path, damage):
    first = make(manifest, tmp_path)
    first.load()
    plan = Path(first.build_report["plan"])
    data = plan.read_bytes()
    if damage == "flip":
        plan.write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))
    elif damage == "truncate":
        plan.write_bytes(data[: len(data) // 2])
    elif damage == "sidecar":
        plan.with_suffix(".json").unlink()
    else:  # a plan of another TensorRT version with a matching sidecar: deserialize returns None
        foreign = data.replace(fake_tensorrt.__version__.encode(), b"10.99.0.00")
        plan.write_bytes(foreign)
        meta = json.loads(plan.with_suffix(".json").read_text())
        meta["plan_sha256"] = __import__("hashlib").sha256(foreign).hexdigest()
        plan.with_suffix(".json").write_text(json.dumps(meta))
    again = make(manifest, tmp_path)
    again.load()
    assert again.build_report["built"], again.build_report
    assert fake_tensorrt.STATE.builds == 2
    want = {"flip": "do not match", "truncate": "do not match", "sidecar": "sidecar",
            "foreign": "could not deserialize"}[damage]
    assert want in again.build_report["reason"]


def test_silent_fp32_build_is_an_error(manifest, tmp_path):
    fake_tensorrt.STATE.drop_int4 = True
    with pytest.raises(BackendUnavailable, match="no INT4 weights: a silent"):
        make(manifest, tmp_path).load()


def test_a_refused_plan_keeps_its_verdict_and_is_not_rebuilt_at_every_start(manifest, tmp_path):
    """GPU code review, session 19: a plan that failed verification had no sidecar, so every start rebuilt it
    (minutes on a GPU) only to refuse it again."""
    from appliance.engines.cuda import probe_device

    fake_tensorrt.STATE.drop_int4 = True
    with pytest.raises(BackendUnavailable, match="no INT4 weights: a silent"):
        make(manifest, tmp_path).load()
    assert fake_tensorrt.STATE.builds == 1
    with pytest.raises(BackendUnavailable, match=r"no INT4 weights: a silent .*verdict cached in .*\.json: delete "
                                                 r"it, or run `appliance models build-engine --force`"):
        make(manifest, tmp_path).load()
    assert fake_tensorrt.STATE.builds == 1  # refused at once, from the sidecar
    fake_tensorrt.STATE.drop_int4 = False
    _, report = ensure_plan(fake_tensorrt, manifest, manifest.artifact("w4a16"), probe_device(fake_cudart),
                            cache_dir=tmp_path, force=True)
    assert report["built"] and fake_tensorrt.STATE.builds == 2 and "refused" not in report
    make(manifest, tmp_path).load()  # the good plan's sidecar replaced the verdict
    assert fake_tensorrt.STATE.builds == 2


def test_weakly_typed_network_would_build_fp32_and_is_caught(manifest, tmp_path):
    from appliance.engines.cuda import probe_device
    from appliance.engines.trt_build import BuildSettings

    with pytest.raises(EngineError, match="silent"):
        ensure_plan(fake_tensorrt, manifest, manifest.artifact("fp16"), probe_device(fake_cudart),
                    cache_dir=tmp_path, settings=BuildSettings(strongly_typed=False))


def test_io_shape_mismatch_with_the_manifest_is_an_error(manifest, tmp_path):
    fake_tensorrt.STATE.output_shape_override = {"heatmap": (8, 8, 8)}
    with pytest.raises(BackendUnavailable, match="heatmap.*does not match the manifest"):
        make(manifest, tmp_path).load()


def test_failed_build_and_unparsable_onnx_name_the_artifact(manifest, tmp_path):
    fake_tensorrt.STATE.fail_build = True
    with pytest.raises(BackendUnavailable, match="failed to build ct-nodule.w4a16.onnx"):
        make(manifest, tmp_path).load()


@pytest.mark.parametrize(("cuda", "version", "words"), [
    ({"driver": False}, None, "no NVIDIA driver"),
    ({"devices": 0}, None, "no CUDA GPU"),
    ({}, "11.4.0.106", "outside the supported range"),
    ({}, "10.12.0.36", "outside the supported range"),
])
def test_unusable_machine_or_tensorrt_version_is_backend_unavailable(manifest, tmp_path, monkeypatch, cuda, version,
                                                                     words):
    fake_cudart.reset(**cuda)
    if version:
        monkeypatch.setattr(fake_tensorrt, "__version__", version)
    with pytest.raises(BackendUnavailable, match=words):
        make(manifest, tmp_path).load()
    assert fake_tensorrt.STATE.builds == 0


def test_outputs_match_ort_cpu_and_cuda_graphs_replay_after_warmup(manifest, tmp_path, batch, reference):
    engine = make(manifest, tmp_path)
    engine.load()
    before = engine.run(batch)
    assert not engine.graph_captured and fake_cudart.STATE.graph_launches == 0
    engine.warmup()
    assert engine.graph_captured
    launches = fake_cudart.STATE.graph_launches
    out = engine.run(batch)
    assert fake_cudart.STATE.graph_launches == launches + 1
    for name in reference:
        np.testing.assert_array_equal(before[name], reference[name])
        np.testing.assert_array_equal(out[name], reference[name])
    engine.close()
    assert fake_cudart.STATE.live_allocations() == 0


def test_two_slots_rotate_and_copy_of_next_batch_overlaps_compute(manifest, tmp_path, batch, reference):
    engine = make(manifest, tmp_path)
    engine.load()
    engine.warmup()
    flipped = batch[::-1].copy()
    fake_cudart.STATE.timeline.clear()
    t0 = engine.submit(batch)
    t1 = engine.submit(flipped)
    assert {t0, t1} == {0, 1}
    with pytest.raises(EngineError, match="already in flight"):
        engine.submit(batch)
    h2d = [e for e in fake_cudart.STATE.timeline if e["label"] == "memcpy cudaMemcpyHostToDevice"]
    assert len(h2d) == 2 and "graph" in h2d[1]["pending"]  # batch 1's copy queued while batch 0's compute pends
    with pytest.raises(EngineError, match="out of order"):
        engine.result(t1)
    a, b = engine.result(t0), engine.result(t1)
    np.testing.assert_array_equal(a["prob"], reference["prob"])
    np.testing.assert_array_equal(b["prob"], reference["prob"][::-1])
    engine.close()


def test_wrong_batch_shape_or_dtype_is_refused(manifest, tmp_path, batch):
    engine = make(manifest, tmp_path)
    engine.load()
    with pytest.raises(EngineError, match=r"float32 \[8, 1, 256, 256\]"):
        engine.run(batch[:4])
    with pytest.raises(EngineError, match="float32"):
        engine.run(batch.astype(np.float64))
    engine.close()


def test_why_unavailable_names_tensorrt_and_the_device_on_this_box() -> None:
    why = TensorrtEngine.why_unavailable()
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert why is not None and "tensorrt is not installed" in why and "pypi.nvidia.com" in why


def test_build_engine_command_names_what_is_missing_here(capsys) -> None:
    from appliance.cli import main as cli_main

    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorrt is installed here")
    assert cli_main(["models", "build-engine", "ct-nodule"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tensorrt is not installed") and "tensorrt-cu13>=10.13,<11" in err


def test_ensure_plan_from_build_engine_reports_built_then_cached(manifest, tmp_path):
    from appliance.engines.cuda import probe_device

    device = probe_device(fake_cudart)
    _, first = ensure_plan(fake_tensorrt, manifest, manifest.artifact("w4a16"), device, cache_dir=tmp_path)
    _, second = ensure_plan(fake_tensorrt, manifest, manifest.artifact("w4a16"), device, cache_dir=tmp_path)
    _, forced = ensure_plan(fake_tensorrt, manifest, manifest.artifact("w4a16"), device, cache_dir=tmp_path,
                            force=True)
    assert (first["built"], second["built"], forced["built"]) == (True, False, True)
    assert forced["reason"] == "forced" and first["key_sha256"] == second["key_sha256"] == forced["key_sha256"]


def test_precision_check_reads_datatypes_not_names() -> None:
    from appliance.engines.trt_build import _type_text

    shuffle = {"Name": "int4_fp16_half_named_layer", "LayerType": "Shuffle",
               "Outputs": [{"Name": "int4_out", "Format/Datatype": "Row major linear FP32 format"}]}
    gemm = {"Name": "gemm", "Inputs": [{"Format/Datatype": "Row major linear FP16 format"}]}
    info = json.dumps({"Layers": [shuffle, gemm], "Bindings": ["int4_in"]})
    text = _type_text(info)
    assert "int4" not in text.lower() and "FP16" in text and "FP32" in text


def test_failed_graph_capture_falls_back_to_direct_enqueue(manifest, tmp_path, batch, reference):
    fake_cudart.STATE.fail["cudaGraphInstantiate"] = fake_cudart.cudaError_t.cudaErrorMemoryAllocation
    engine = make(manifest, tmp_path)
    engine.load()
    engine.warmup()
    assert not engine.graph_captured and "cudaErrorMemoryAllocation" in engine.graph_error
    assert all(s.capture is None for s in fake_cudart.STATE.streams)  # no stream left in capture mode
    np.testing.assert_array_equal(engine.run(batch)["prob"], reference["prob"])
    engine.close()


def test_an_unexpected_error_mid_capture_leaves_no_stream_capturing(manifest, tmp_path):
    """GPU code review, session 19: only an EngineError ended the capture; anything else left the compute stream in
    capture mode, and every later CUDA call on it failed."""
    engine = make(manifest, tmp_path)
    engine.load()

    def broken(stream: int) -> bool:
        raise RuntimeError("a bug in the enqueue path")

    engine._context.execute_async_v3 = broken
    with pytest.raises(RuntimeError, match="a bug"):
        engine._capture()
    assert all(s.capture is None for s in fake_cudart.STATE.streams)
    engine.close()


def test_streams_do_not_sync_with_the_default_stream_and_waits_sleep(manifest, tmp_path):
    """GPU code review, session 19: default events spin a CPU core in cudaEventSynchronize for the whole batch, and
    default streams synchronise with the legacy default stream."""
    engine = make(manifest, tmp_path)
    engine.load()
    assert fake_cudart.STATE.streams and all(s.flags == fake_cudart.cudaStreamNonBlocking
                                             for s in fake_cudart.STATE.streams)
    events = [e for slots in engine._events.values() for e in slots]
    assert len(events) == 6 and all(
        e.flags == fake_cudart.cudaEventBlockingSync | fake_cudart.cudaEventDisableTiming for e in events)
    engine.close()


def test_allocation_failure_is_backend_unavailable_and_frees_what_it_got(manifest, tmp_path):
    fake_cudart.STATE.fail["cudaMalloc"] = fake_cudart.cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(BackendUnavailable, match="cudaMalloc failed: cudaErrorMemoryAllocation"):
        make(manifest, tmp_path).load()
    assert fake_cudart.STATE.live_allocations() == 0
