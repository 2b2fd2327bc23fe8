"""Test helpers shared across tests/ (imported as ``tests.support``): the fake model repository writer, a
config for the fake engine, and an App served on loopback from its own event-loop thread."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from appliance.manifest import Manifest, load_manifest
from appliance.tools.procs import free_port, stop_process

__all__ = ["REPO", "RunningApp", "fake_config", "fake_daemon_config", "fake_daemon_toml", "free_port",
           "stop_process", "write_fake_model"]

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
jpeg2000_lowpass = true

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


#: gRPC channel options for a connection of its own (Python channels otherwise share one per target): another
#: peer, as another client -- the daemon's turn-taking and admission share go by peer (docs/robustness.md).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


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


def fake_daemon_config(tmp: Path, listen: list[str], *, server: str = "", engine: str = "",
                       metrics: str = "127.0.0.1:0", name: str = "appliance.toml") -> Path:
    """Write :func:`fake_daemon_toml` to ``tmp/<name>`` and return its path."""
    cfg = tmp / name
    cfg.write_text(fake_daemon_toml(tmp, listen, server=server, engine=engine, metrics=metrics))
    return cfg


def fake_daemon_toml(tmp: Path, listen: list[str], *, server: str = "", engine: str = "",
                     metrics: str = "127.0.0.1:0") -> str:
    """TOML for ``appliance serve`` on the fake engine and a fake ``ct-nodule`` model written under
    ``tmp/models`` (B=4, 1x256x256), the real pipelines, no thermal sensor. ``server`` and ``engine`` are extra
    TOML lines for those sections."""
    import json

    models = tmp / "models"
    if not (models / "ct-nodule" / "model.toml").exists():
        write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    return f"""
[server]
listen = {json.dumps(listen)}
{server}
[model]
models_dir = "{models}"
pipelines_dir = "{REPO / "pipelines"}"
[engine]
backend = "fake"
warmup_runs = 1
{engine}
[thermal]
sensor = "none"
[metrics]
listen = "{metrics}"
"""
