"""Engine backends against the shared conformance check (tests/engine_conformance.py).

- ONNX Runtime on the CPU: the reference.
- The fake engine: the contract without numbers.
- ``triton``: against a real tritonserver (PyTriton's bundled one, in its own venv) serving the same ONNX, and
  against the appliance's own Open Inference Protocol server (fast, no side venv).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from appliance.engines import AUTO_ORDER, BACKENDS, resolve
from appliance.engines.fake import FakeEngine
from appliance.engines.onnxruntime import OrtCpuEngine
from appliance.engines.triton import TritonEngine
from appliance.errors import BackendUnavailable, ConfigError, EngineDeadError, EngineError
from appliance.manifest import Manifest, load_manifest
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import RecordingNotifier
from appliance.tools import synthetic
from appliance.tools.procs import stop_process
from tests.engine_conformance import assert_conforms, reference_batch
from tests.interop import venvs
from tests.oip_support import LoopbackOip
from tests.support import REPO, RunningApp, fake_config

SERVER = Path(__file__).resolve().parents[1] / "interop" / "pytriton_server.py"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REPO / "models" / "ct-nodule" / "model.toml")


@pytest.fixture(scope="module")
def batch(manifest: Manifest) -> np.ndarray:
    return reference_batch(manifest)


@pytest.fixture(scope="module")
def reference(manifest: Manifest, batch: np.ndarray) -> dict[str, np.ndarray]:
    engine = OrtCpuEngine(manifest, manifest.artifact(None), {})
    engine.load()
    try:
        return engine.run(batch)
    finally:
        engine.close()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_registry_has_triton_but_auto_never_picks_it() -> None:
    assert BACKENDS["triton"] == "appliance.engines.triton:TritonEngine"
    assert "triton" not in AUTO_ORDER
    cls, _ = resolve("triton")
    assert cls is TritonEngine and cls.why_unavailable() is None


def test_ort_cpu_conforms(manifest: Manifest, batch: np.ndarray, reference: dict[str, np.ndarray]) -> None:
    engine = OrtCpuEngine(manifest, manifest.artifact(None), {})
    assert_conforms(engine, batch, reference, atol=0.0, backend_prefix="onnxruntime:CPUExecutionProvider")


def test_ort_cpu_burst_session_is_bit_identical_and_only_used_when_asked(
        manifest: Manifest, batch: np.ndarray, reference: dict[str, np.ndarray]) -> None:
    engine = OrtCpuEngine(manifest, manifest.artifact(None), {"burst_threads": 2, "worker_nice": 12})
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    engine.load()
    try:
        engine.warmup(1)
        assert engine.burst_batches == 0  # warm-up is not counted
        # the burst pool's threads yield to the preprocessing workers (here 12 below us) when one wakes up
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # the calling thread keeps its own
        assert engine.burst_tids and all(os.getpriority(os.PRIO_PROCESS, t) == min(19, here + 17)
                                         for t in engine.burst_tids)
        assert engine.host_cores() == 1  # the intra-op thread
        engine.set_burst(True)
        assert engine.host_cores() == 2  # the burst session's threads: the decoders leave them alone
        wide = engine.run(batch)
        engine.set_burst(False)
        assert engine.host_cores() == 1
        narrow = engine.run(batch)
        assert engine.burst_batches == 1
        for name in reference:  # more threads split the work, never the sums: the same bits
            assert np.array_equal(wide[name], reference[name]) and np.array_equal(narrow[name], reference[name])
    finally:
        engine.close()
    single = OrtCpuEngine(manifest, manifest.artifact(None), {"burst_threads": 1})
    single.load()
    try:
        single.set_burst(True)  # no burst session: ignored
        assert single.host_cores() == 1
        single.run(batch)
        assert single.burst_batches == 0
    finally:
        single.close()


def test_fake_engine_conforms(manifest: Manifest, batch: np.ndarray) -> None:
    assert_conforms(FakeEngine(manifest, manifest.artifact(None), {}), batch, None, backend_prefix="fake")


# ---- triton against the appliance's own OIP server (no side venv) ------------------------------------------


@pytest.fixture(scope="module")
def loopback(models_dir: Path) -> Iterator[LoopbackOip]:
    server = LoopbackOip(models_dir)
    yield server
    server.stop()


def test_triton_engine_over_oip_matches_the_remote_engine(loopback: LoopbackOip, models_dir: Path) -> None:
    fake = load_manifest(models_dir / "ct-nodule" / "model.toml")  # B=4, like the loopback's fake engine
    rows = np.random.default_rng(5).random((4, 1, 256, 256), dtype=np.float32)
    local = FakeEngine(fake, fake.artifact(None), {})
    local.load()
    assert_conforms(
        TritonEngine(fake, fake.artifact(None), {"url": loopback.address}),
        rows,
        local.run(rows),
        backend_prefix="triton:edge-appliance",
    )


def test_triton_engine_refuses_a_mismatched_remote(loopback: LoopbackOip, manifest: Manifest) -> None:
    # a configuration error (exit 78, not 1: systemd must not retry it; ops review, session 18)
    with pytest.raises(ConfigError, match="config key engine.options.url is empty"):
        TritonEngine(manifest, manifest.artifact(None), {}).load()
    with pytest.raises(BackendUnavailable, match="not ready"):
        TritonEngine(
            manifest, manifest.artifact(None), {"url": loopback.address, "model_name": "nope", "load_timeout_s": 0.3}
        ).load()
    engine = TritonEngine(manifest, manifest.artifact(None), {"url": loopback.address})
    engine.load()  # B=8 fits the remote's [-1, 1, 256, 256]; the remote then refuses 8 > max_batch_size 4
    try:
        with pytest.raises(EngineError, match="INVALID_ARGUMENT"):
            engine.run(np.zeros((8, 1, 256, 256), dtype=np.float32))
    finally:
        engine.close()


def test_lost_remote_fails_the_batch_with_engine_error(models_dir: Path) -> None:
    fake = load_manifest(models_dir / "ct-nodule" / "model.toml")
    remote = LoopbackOip(models_dir)
    engine = TritonEngine(fake, fake.artifact(None), {"url": remote.address, "timeout_s": 1.0})
    engine.load()
    try:
        rows = np.zeros((4, 1, 256, 256), dtype=np.float32)
        assert engine.run(rows)["prob"].shape == (4, 1)
        remote.stop()
        with pytest.raises(EngineError, match="UNAVAILABLE|DEADLINE_EXCEEDED") as e:
            engine.run(rows)
        assert not isinstance(e.value, EngineDeadError)  # one failed batch: the remote may come back
    finally:
        engine.close()


def test_daemon_offloads_batches_to_a_remote_server(loopback: LoopbackOip, models_dir: Path) -> None:
    """`appliance serve` with the triton backend: DICOM local, inference remote (here: another appliance)."""
    before = len(loopback.engine.batches)
    config = fake_config(models_dir, engine={"backend": "triton", "options": {"url": loopback.address}})
    app = RunningApp(config, notifier=RecordingNotifier())
    try:
        assert app.app.engine.backend.startswith("triton:edge-appliance")
        truth = synthetic.generate_slice(9, nodule=True, size=512)
        with grpc.insecure_channel(app.target) as channel:
            reply = pb_grpc.InferenceStub(channel).Analyze(
                pb.AnalyzeRequest(dicom=synthetic.to_dicom(truth)), timeout=20
            )
        expected = float(synthetic.model_input(truth, load_manifest(models_dir / "ct-nodule" / "model.toml")).mean())
        nodule = next(f.score for f in reply.frames[0].findings if f.label == "nodule")
        assert nodule == pytest.approx(expected, abs=1e-5)
        assert reply.model.backend.startswith("triton:")
        assert len(loopback.engine.batches) > before  # the batch ran on the remote's engine
    finally:
        app.stop()


# ---- triton against a real tritonserver (PyTriton) ---------------------------------------------------------


@pytest.fixture(scope="module")
def pytriton(manifest: Manifest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real tritonserver on loopback serving the bundled INT4 ONNX; yields its gRPC address."""
    try:
        python = venvs.ensure("pytriton", timeout_s=240)  # under pytest-timeout: skip, not fail
    except venvs.VenvUnavailable as e:
        pytest.skip(f"PyTriton side venv unavailable: {e}")
    artifact = manifest.artifact(None)
    grpc_port, http_port, metrics_port = _port(), _port(), _port()
    log = tmp_path_factory.mktemp("pytriton") / "server.log"
    entries = [f"{k}={v}" for k, v in artifact.session_config.items()]
    cmd = [str(python), str(SERVER), str(artifact.path), manifest.name, str(grpc_port), str(http_port)]
    cmd += [str(metrics_port), str(log.parent / "workspace"), *entries]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=venvs.libpython_env(python))
    try:
        yield f"127.0.0.1:{grpc_port}"
    finally:
        stop_process(proc)
    if proc.returncode not in (0, -15):
        print(log.read_text()[-3000:])


def test_triton_engine_conforms_against_real_tritonserver(
    pytriton: str, manifest: Manifest, batch: np.ndarray, reference: dict[str, np.ndarray]
) -> None:
    t0 = time.monotonic()
    engine = TritonEngine(manifest, manifest.artifact(None), {"url": pytriton, "load_timeout_s": 120})
    assert_conforms(engine, batch, reference, atol=1e-5, backend_prefix="triton:triton ")
    assert time.monotonic() - t0 < 120
