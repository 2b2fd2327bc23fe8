"""Shared fixtures: a tiny fake model repository, a stub pipeline and instance for batcher tests."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from appliance.manifest import Manifest, load_manifest

REPO = Path(__file__).resolve().parent.parent

FAKE_MODEL_TOML = """
format_version = 1
name = "{name}"
version = "0.0.1"
description = "a tiny manifest for the fake engine"
default_precision = "fp32"

[input]
name = "image"
shape = [{b}, 1, {h}, {w}]
dtype = "float32"
[input.preprocess]
window_center = -600.0
window_width = 1500.0
resize = "area"
normalize = "window_unit"
photometric = "MONOCHROME2"

[[outputs]]
name = "prob"
shape = [{b}, 1]
meaning = "mean of the input"
[[outputs]]
name = "heatmap"
shape = [{b}, {hh}, {hw}]
meaning = "input average-pooled to 2x2"

[postprocess]
threshold = 0.5
labels = ["no_nodule", "nodule"]

[artifacts.fp32]
file = "fake.onnx"
precision = "fp32"
sha256 = "{sha}"
bytes = {size}
"""


def write_fake_model(
    models_dir: Path, batch: int = 4, h: int = 8, w: int = 8, name: str = "fake-model", heatmap: int = 2
) -> Manifest:
    """Write models_dir/<name>/{model.toml,fake.onnx} (for the fake engine) and return the loaded manifest."""
    d = models_dir / name
    d.mkdir(parents=True, exist_ok=True)
    blob = b"not really onnx; the fake engine never reads it\n"
    (d / "fake.onnx").write_bytes(blob)
    text = FAKE_MODEL_TOML.format(
        name=name, b=batch, h=h, w=w, hh=heatmap, hw=heatmap, sha=hashlib.sha256(blob).hexdigest(), size=len(blob)
    )
    (d / "model.toml").write_text(text)
    return load_manifest(d / "model.toml")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding a fake "ct-nodule" (B=4, 1x256x256, 16x16 map) for the fake engine."""
    d = tmp_path_factory.mktemp("models")
    write_fake_model(d, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    return d


@pytest.fixture
def fake_manifest(tmp_path: Path) -> Manifest:
    """A B=4, 1x8x8 manifest whose artifact verifies."""
    return write_fake_model(tmp_path / "models")


@dataclass
class StubInstance:
    """Stands in for a DicomInstance: frame i has constant value values[i]."""

    values: list[float]
    sop_instance_uid: str = "1.2.3"

    @property
    def number_of_frames(self) -> int:
        return len(self.values)


class StubPipeline:
    """Writes the instance's frame value into the slot; optional delay, failure, or gate."""

    name = "stub"
    model = "fake-model"

    def __init__(self, delay_s: float = 0.0, fail_frames: set[int] | None = None) -> None:
        self.delay_s = delay_s
        self.fail_frames = fail_frames or set()
        self.gate: threading.Event | None = None
        self.calls: list[tuple[float, float]] = []  # (start, end) monotonic per run
        self._lock = threading.Lock()

    def check(self, inst: StubInstance) -> None:
        pass

    def run(self, inst: StubInstance, frame: int, out: np.ndarray) -> None:
        import time

        from appliance.errors import DicomError

        t0 = time.monotonic()
        if self.gate is not None:
            self.gate.wait(5)
        if self.delay_s:
            time.sleep(self.delay_s)
        if frame in self.fail_frames:
            raise DicomError("(7FE0,0010) Pixel Data: stub failure", field="dicom.PixelData")
        out[...] = inst.values[frame]
        with self._lock:
            self.calls.append((t0, time.monotonic()))


class Feeder:
    """Stands in for the worker pool in batcher tests: threads run a stub pipeline into the batcher's slots.

    Frames are taken INTERACTIVE first, oldest first, and reported through the batcher's pool interface
    (``begin_frame`` / ``frame_ready`` / ``frame_failed``), holding ``stage_lock`` in sequential mode.
    """

    def __init__(self, batcher, workers: int = 1) -> None:  # noqa: ANN001
        import collections

        from appliance.batching.work import Priority

        self.batcher = batcher
        self._cond = threading.Condition()
        self._queues = {p: collections.deque() for p in Priority}
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def feed(self, request, instance, pipeline) -> None:  # noqa: ANN001
        with self._cond:
            self._queues[request.priority].extend((item, instance, pipeline) for item in request.items)
            self._cond.notify_all()

    def _run(self) -> None:
        import contextlib

        from appliance.errors import ApplianceError

        while True:
            with self._cond:
                while not self._stopping and not any(self._queues.values()):
                    self._cond.wait()
                if self._stopping:
                    return
                item, inst, pipe = next(q for q in self._queues.values() if q).popleft()
            if not self.batcher.begin_frame(item):
                continue
            lock = self.batcher.stage_lock or contextlib.nullcontext()
            with lock:
                try:
                    info = pipe.run(inst, item.frame_index, self.batcher.slots[item.slot])
                except ApplianceError as e:
                    self.batcher.frame_failed(item, e)
                    continue
            self.batcher.frame_ready(item, info, 0.1)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(2)


class RunningApp:
    """An App serving on loopback from its own event-loop thread; tests use sync gRPC clients."""

    def __init__(self, config, **kwargs) -> None:  # noqa: ANN001
        import asyncio

        from appliance.serving.app import App

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.app = App(config, **kwargs)
        asyncio.run_coroutine_threadsafe(self.app.start(), self.loop).result(60)
        self.target = next(a for a in self.app.addresses if not a.startswith("unix:"))

    def call(self, coro):  # noqa: ANN001, ANN201
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self, grace_s: float = 2.0) -> None:
        self.call(self.app.stop(grace_s))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def fake_config(models_dir: Path, **sections):  # noqa: ANN003, ANN201
    """A Config for the fake engine on a free loopback port, no thermal sensor, the real pipelines dir."""
    from appliance.config import load_config

    overrides = {
        "server": {"listen": ["127.0.0.1:0"], "grace_s": 2.0},
        "model": {"models_dir": str(models_dir), "pipelines_dir": str(REPO / "pipelines")},
        "engine": {"backend": "fake", "warmup_runs": 1},
        "thermal": {"sensor": "none"},
        "metrics": {"listen": "127.0.0.1:0"},  # never the default 9400: daemons in tests must not collide
    }
    for key, values in sections.items():
        overrides.setdefault(key, {}).update(values)
    return load_config(None, overrides)
