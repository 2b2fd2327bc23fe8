"""The FakeAnalyzer keeps the request path's observable rules: fixed padded batches, INTERACTIVE first, a bounded
queue (Overloaded, counted as a rejection), deadlines (DeadlineExceeded), DICOM errors by class."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from appliance.batching.work import Priority
from appliance.engines.fake import FakeEngine
from appliance.errors import DeadlineExceeded, DicomError, Overloaded, Unavailable
from appliance.fakes.analyzer import FakeAnalyzer
from appliance.manifest import load_manifest
from appliance.serving.metrics import Metrics
from appliance.tools import synthetic


def analyzer(models_dir: Path, **options) -> FakeAnalyzer:  # noqa: ANN003
    manifest = load_manifest(models_dir / "ct-nodule" / "model.toml")
    engine = FakeEngine(manifest, manifest.artifact(None), options)
    engine.load()
    return FakeAnalyzer(engine, capacity=8, observer=Metrics())


def test_model_info_and_padded_batches(models_dir: Path) -> None:
    a = analyzer(models_dir)
    assert (a.model.name, a.model.batch_size, a.model.item_shape) == ("ct-nodule", 4, (1, 256, 256))
    assert a.model.outputs == (("prob", (1,)), ("heatmap", (16, 16)))
    x = np.random.default_rng(1).random((5, 1, 256, 256), dtype=np.float32)
    rows = asyncio.run(a.infer(x))
    np.testing.assert_allclose([r["prob"][0] for r in rows], x.reshape(5, -1).mean(axis=1), rtol=1e-6)
    assert a.engine.real_rows() == [4, 1]  # two fixed batches of B=4, the second padded
    a.close()


def test_interactive_rows_go_first(models_dir: Path) -> None:
    gate = threading.Event()
    a = analyzer(models_dir, hang=gate)

    async def scenario() -> None:
        first = asyncio.ensure_future(a.infer(np.zeros((4, 1, 256, 256), np.float32)))  # occupies the engine
        await asyncio.sleep(0.05)
        batch = asyncio.ensure_future(a.infer(np.full((4, 1, 256, 256), 0.25, np.float32)))
        urgent = asyncio.ensure_future(
            a.infer(np.full((4, 1, 256, 256), 0.75, np.float32), priority=Priority.INTERACTIVE)
        )
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(first, batch, urgent)

    asyncio.run(scenario())
    means = [float(b.mean()) for b in a.engine.batches]
    assert means == pytest.approx([0.0, 0.75, 0.25])
    a.close()


def test_full_queue_and_deadline(models_dir: Path) -> None:
    gate = threading.Event()
    a = analyzer(models_dir, hang=gate)

    async def scenario() -> None:
        running = asyncio.ensure_future(a.infer(np.zeros((8, 1, 256, 256), np.float32)))
        await asyncio.sleep(0.05)  # 4 rows on the engine, 4 waiting
        with pytest.raises(Overloaded, match="queue full"):
            await a.infer(np.zeros((5, 1, 256, 256), np.float32))
        with pytest.raises(DeadlineExceeded):
            await a.infer(np.zeros((1, 1, 256, 256), np.float32), time_remaining=0.05)
        with pytest.raises(DeadlineExceeded):
            await a.infer(np.zeros((1, 1, 256, 256), np.float32), time_remaining=0.0)
        gate.set()
        await running

    asyncio.run(scenario())
    assert a.observer.registry.get_sample_value("appliance_rejections_total", {"reason": "QUEUE_FULL"}) == 1
    a.close()


def test_analyze_and_its_errors(models_dir: Path) -> None:
    a = analyzer(models_dir)
    truth = synthetic.generate_slice(3, nodule=True, size=512)
    result = asyncio.run(a.analyze(synthetic.to_dicom(truth), request_id="r"))
    (frame,) = result.frames
    expected = synthetic.model_input(truth, {"window_center": -600.0, "window_width": 1500.0, "size": (256, 256)})
    assert frame.outputs["prob"][0] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert frame.label == ("nodule" if expected.mean() >= 0.5 else "no_nodule")
    assert result.total_ms >= result.engine_ms > 0 and result.request_id == "r"
    with pytest.raises(DicomError, match="not a DICOM"):
        asyncio.run(a.analyze(b"nope"))
    a.ready = False
    with pytest.raises(Unavailable):
        asyncio.run(a.analyze(b"nope"))
    a.close()


def test_an_engine_bug_fails_its_batch_and_the_next_request_still_runs(models_dir: Path) -> None:
    """As the batcher does: before, a non-appliance error killed the fake's loop and the request hung."""
    from appliance.errors import EngineError

    a = analyzer(models_dir)
    real_run = a.engine.run
    calls = {"n": 0}

    def flaky(batch: np.ndarray) -> dict[str, np.ndarray]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise FloatingPointError("overflow in the kernel")
        return real_run(batch)

    a.engine.run = flaky  # type: ignore[method-assign]

    async def scenario() -> None:
        with pytest.raises(EngineError, match="engine failed: FloatingPointError: overflow in the kernel"):
            await asyncio.wait_for(a.infer(np.zeros((1, 1, 256, 256), np.float32)), 10)
        rows = await asyncio.wait_for(a.infer(np.full((1, 1, 256, 256), 0.5, np.float32)), 10)
        assert rows[0]["prob"][0] == pytest.approx(0.5)

    asyncio.run(scenario())
    a.close()
