"""The CUDA backend's IOBinding path (fixed buffers, update_inplace, outputs read back), run by real ONNX
Runtime on CPU buffers: the same calls the GPU path makes, minus the device. The CUDA graph itself needs a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from appliance.engines.onnxruntime import OrtCpuEngine, OrtCudaEngine, _OrtEngine
from appliance.manifest import load_manifest

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "ct-nodule"


class _BoundOnCpu(OrtCudaEngine):
    PROVIDER = "CPUExecutionProvider"
    BIND_DEVICE = "cpu"

    def _providers(self) -> list[Any]:
        return [self.PROVIDER]

    def _session_options(self) -> Any:
        return _OrtEngine._session_options(self)  # the CPU EP cannot be combined with disable_cpu_ep_fallback


def test_bound_buffers_are_reused_and_refreshed_each_run() -> None:
    manifest = load_manifest(MODEL_DIR / "model.toml")
    bound = _BoundOnCpu(manifest, manifest.artifact())
    bound.load()
    plain = OrtCpuEngine(manifest, manifest.artifact())
    plain.load()
    rng = np.random.default_rng(3)
    first_input = bound._input
    for _ in range(3):
        x = rng.random((8, 1, 256, 256), dtype=np.float32)
        got, want = bound.run(x), plain.run(x)
        assert bound._input is first_input  # the same bound buffer every run (what a CUDA graph needs)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    bound.close()
