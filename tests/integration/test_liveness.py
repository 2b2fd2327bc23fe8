"""Every stage's progress feeds health and the watchdog: a stall is NOT_SERVING, a dead thermal loop too."""

from __future__ import annotations

import math
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.health import ServiceState
from appliance.serving.liveness import Stage, StageProgress, stalled
from appliance.serving.notify import RecordingNotifier
from appliance.tools import synthetic
from tests.support import RunningApp, fake_config, write_fake_model


def test_stalled_names_only_stages_with_pending_work_and_no_progress() -> None:
    idle = Stage("idle", lambda: StageProgress(0, 0.0), 1.0)
    busy_fresh = Stage("fresh", lambda: StageProgress(3, 99.5), 1.0)
    busy_stale = Stage("stale", lambda: StageProgress(2, 90.0), 5.0)
    assert stalled([idle, busy_fresh, busy_stale], now=100.0) == ["stale (10 s without progress, 2 pending)"]
    assert stalled([idle, busy_fresh], now=100.0) == []


@pytest.fixture
def app(tmp_path):
    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    running = RunningApp(fake_config(models, server={"stall_s": 1.0}), notifier=RecordingNotifier())
    yield running
    running.stop()


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status


def _wait(predicate, timeout: float = 5.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_wedged_stage_is_not_serving_and_stops_the_watchdog_until_it_moves(app) -> None:
    state = {"progress": StageProgress(1, time.monotonic() - 60.0)}
    app.app.stages = [*app.app.stages, Stage("decoder", lambda: state["progress"], 1.0)]
    assert _wait(lambda: app.app.health.state == ServiceState.NOT_SERVING)
    assert "stalled: decoder" in app.app.health.reason
    assert _health(app.target) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert app.app._heartbeat() == -math.inf  # WATCHDOG=1 withheld
    state["progress"] = StageProgress(0, time.monotonic())  # it moved again
    assert _wait(lambda: app.app.health.state == ServiceState.SERVING)
    with grpc.insecure_channel(app.target) as ch:
        data = synthetic.to_dicom(synthetic.generate_slice(1, size=256))
        assert pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=data), timeout=10).frames


def test_a_dead_thermal_loop_is_a_fault(app) -> None:
    def boom() -> float:
        raise RuntimeError("thermometer bug")

    app.app.thermal.tick_safely = boom  # the loop calls it only when enabled
    app.app.thermal.snapshot = boom
    assert _wait(lambda: app.app.health.state == ServiceState.NOT_SERVING)
    assert "thermal loop died" in app.app.health.reason
