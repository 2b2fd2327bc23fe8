"""Every backend that can run here gets the same reference inputs and must give the reference outputs.

The reference is ONNX Runtime on the CPU running the same artifact; the bound is the artifact's manifest
``tolerance``. GPU backends carry the ``gpu`` marker and skip with the reason this machine gives. The
TensorRT backend also runs here against the shipped fakes (``tensorrt-fake``), which checks the plumbing
(pinned slots, graph replay, output order), not TensorRT's numerics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from appliance.engines import BACKENDS, _load_class
from appliance.engines.onnxruntime import OrtCpuEngine
from appliance.manifest import Manifest, load_manifest
from appliance.tools import synthetic

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "ct-nodule"
GPU = pytest.mark.gpu


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(MODEL_DIR / "model.toml")


@pytest.fixture(scope="module")
def inputs(manifest: Manifest) -> np.ndarray:
    slices = [synthetic.generate_slice(500 + i, nodule=bool(i % 2), size=512) for i in range(8)]
    return np.stack([synthetic.model_input(t, manifest) for t in slices]).astype(np.float32)


def _reference(manifest: Manifest, precision: str, x: np.ndarray) -> dict[str, np.ndarray]:
    cpu = OrtCpuEngine(manifest, manifest.artifact(precision))
    cpu.load()
    return cpu.run(x)


@pytest.mark.parametrize(("backend", "precision"), [
    ("onnxruntime-cpu", "int4"),
    ("onnxruntime-cpu", "w4a16"),
    ("onnxruntime-cpu", "fp16"),
    pytest.param("onnxruntime-cuda", "int4", marks=GPU),
    pytest.param("onnxruntime-cuda", "fp16", marks=GPU),
    pytest.param("onnxruntime-tensorrt", "w4a16", marks=GPU),
    pytest.param("tensorrt", "w4a16", marks=GPU),
    pytest.param("tensorrt", "fp16", marks=GPU),
])
def test_backend_matches_the_cpu_reference(manifest, inputs, backend, precision, tmp_path) -> None:
    cls = _load_class(backend)
    why = cls.why_unavailable()
    if why is not None:
        pytest.skip(f"{backend} unavailable here: {why}")
    artifact = manifest.artifact(precision)
    engine = cls(manifest, artifact, {"precision": precision, "cache_dir": tmp_path})
    engine.load()
    engine.warmup(2)
    got = engine.run(inputs)
    engine.close()
    ref = _reference(manifest, precision, inputs)
    assert set(got) == {o.name for o in manifest.outputs}
    for name, want in ref.items():
        assert got[name].shape == want.shape and got[name].dtype == np.float32
        diff = float(np.abs(got[name] - want).max())
        assert diff <= artifact.tolerance, f"{backend} {precision} {name}: max |diff| {diff} > {artifact.tolerance}"


def test_tensorrt_backend_on_the_fakes_matches_the_reference(manifest, inputs, tmp_path) -> None:
    from appliance.engines import fake_cudart, fake_tensorrt
    from appliance.engines.tensorrt import TensorrtEngine

    fake_cudart.reset()
    fake_tensorrt.reset()
    engine = TensorrtEngine(manifest, manifest.artifact(), {"trt_module": fake_tensorrt, "cudart": fake_cudart,
                                                            "cache_dir": tmp_path})
    engine.load()
    engine.warmup(2)
    got = engine.run(inputs)
    engine.close()
    ref = _reference(manifest, "w4a16", inputs)
    for name, want in ref.items():
        np.testing.assert_allclose(got[name], want, atol=manifest.artifact("w4a16").tolerance)


def test_every_registered_backend_is_covered() -> None:
    # triton (the remote backend) is held to the same reference against a real tritonserver in
    # tests/integration/test_engines.py (tests/engine_conformance.py)
    assert set(BACKENDS) - {"fake"} == {"onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt",
                                        "triton"}
