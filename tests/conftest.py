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
name = "fake-model"
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
shape = [{b}, 2, 2]
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


def write_fake_model(models_dir: Path, batch: int = 4, h: int = 8, w: int = 8) -> Manifest:
    """Write models_dir/fake-model/{model.toml,fake.onnx} and return the loaded manifest."""
    d = models_dir / "fake-model"
    d.mkdir(parents=True, exist_ok=True)
    blob = b"not really onnx; the fake engine never reads it\n"
    (d / "fake.onnx").write_bytes(blob)
    text = FAKE_MODEL_TOML.format(b=batch, h=h, w=w, sha=hashlib.sha256(blob).hexdigest(), size=len(blob))
    (d / "model.toml").write_text(text)
    return load_manifest(d / "model.toml")


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
