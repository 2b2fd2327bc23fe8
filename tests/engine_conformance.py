"""The engine contract every backend must pass (appliance/engines/base.py), shared by the engine tests.

:func:`assert_conforms` loads and warms the engine, then checks on the reference batch: output names, shapes
and dtype; numerical agreement with the reference backend (ONNX Runtime on the CPU); that rows are
independent (permuting rows permutes outputs, and zero padding rows never change real rows, which fixed
batches with padding rely on); that the shape guard rejects a wrong batch; and that ``backend`` names what
runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from appliance.engines.base import Engine
from appliance.errors import EngineError
from appliance.manifest import Manifest
from appliance.tools import synthetic


def reference_batch(manifest: Manifest, seed: int = 11) -> np.ndarray:
    """B real model inputs: synthetic CT slices, half with a nodule, preprocessed as serving does."""
    b = manifest.input.batch_size
    slices = [synthetic.generate_slice(seed + i, nodule=i % 2 == 0, size=512) for i in range(b)]
    return np.stack([synthetic.model_input(s, manifest) for s in slices]).astype(np.float32)


def assert_conforms(
    engine: Engine,
    batch: np.ndarray,
    reference: dict[str, np.ndarray] | None,
    *,
    atol: float = 1e-5,
    backend_prefix: str = "",
) -> None:
    """Check ``engine`` (not yet loaded) against the contract; ``reference``: expected outputs for ``batch``."""
    engine.load()
    engine.warmup(1)
    try:
        assert engine.backend.startswith(backend_prefix), engine.backend
        b = engine.batch_size
        out = engine.run(batch)
        assert set(out) == set(engine.output_names)
        for spec in engine.manifest.outputs:
            value = out[spec.name]
            assert value.dtype == np.float32, spec.name
            assert value.shape == tuple(spec.shape), (spec.name, value.shape)
            assert np.isfinite(value).all(), spec.name
            if reference is not None:
                np.testing.assert_allclose(value, reference[spec.name], atol=atol, err_msg=spec.name)

        order = np.random.default_rng(0).permutation(b)
        permuted = engine.run(np.ascontiguousarray(batch[order]))
        half = b // 2
        padded = batch.copy()
        padded[half:] = 0.0  # a partial batch: the real rows first, zero padding after
        partial = engine.run(padded)
        for name in engine.output_names:
            np.testing.assert_allclose(permuted[name], out[name][order], atol=atol, err_msg=f"{name}: rows mix")
            np.testing.assert_allclose(partial[name][:half], out[name][:half], atol=atol, err_msg=f"{name}: padding")

        with pytest.raises(EngineError, match="engine input must be"):
            engine.run(batch[: b - 1])
        with pytest.raises(EngineError, match="engine input must be"):
            engine.run(batch.astype(np.float64))
    finally:
        engine.close()
