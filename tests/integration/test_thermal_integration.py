"""The governor wired into the daemon: NVML (through the fake pynvml) -> controller -> pacer, status,
health names and `appliance health` exit codes; the simulated plant via `serve --thermal sim`."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from appliance.cli import main as cli_main
from appliance.clock import RealClock
from appliance.governor import Governor, ThermalConfig
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import RecordingNotifier
from appliance.thermal.control import ThermalController
from appliance.thermal.fake_pynvml import FakePynvml
from appliance.thermal.nvml import NvmlThermometer
from appliance.tools import synthetic
from tests.support import RunningApp, fake_config


@contextlib.contextmanager
def nvml_app(models_dir: Path, nvml: FakePynvml, **sections) -> Iterator[RunningApp]:  # noqa: ANN003
    """A daemon whose governor reads the fake NVML; yields once the first reading shows in the status."""
    controller = ThermalController(NvmlThermometer(0, nvml), Governor(ThermalConfig()), clock=RealClock())
    cfg = fake_config(models_dir, thermal={"sensor": "nvml", "period_s": 0.05}, **sections)
    app = RunningApp(cfg, notifier=RecordingNotifier(), thermal=controller)
    try:
        _until(lambda: _status(app.target).thermal.temperature_c == nvml.temperature)
        yield app
    finally:
        app.stop()


def _health(target: str, name: str) -> int:
    with grpc.insecure_channel(target) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status


def _status(target: str) -> pb.Status:
    with grpc.insecure_channel(target) as ch:
        return pb_grpc.InferenceStub(ch).GetStatus(pb.GetStatusRequest(), timeout=5)


def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_hot_gpu_throttles_and_health_warns(models_dir: Path, capsys) -> None:
    nvml = FakePynvml(temperature=50, power_mw=30_000)  # idle draw
    with nvml_app(models_dir, nvml) as app:
        status = _status(app.target)
        assert status.thermal.enabled and status.state == "SERVING"
        assert cli_main(["health", "--target", app.target]) == 0
        nvml.temperature = 76  # over the setpoint and the guard: back off
        # at once: a jump up to 76 °C is held at no more than the blind duty until 5 readings confirm it (HOLDING)
        _until(lambda: _status(app.target).thermal.duty <= ThermalConfig().blind_duty)
        _until(lambda: _status(app.target).thermal.state in ("THROTTLING", "EMERGENCY"))  # then the PI throttles
        status = _status(app.target)
        assert status.thermal.state in ("THROTTLING", "EMERGENCY") and status.thermal.duty < 0.99
        assert status.state == "DEGRADED" and any("thermal" in r for r in status.degraded_reasons)
        assert app.app.pacer.duty == pytest.approx(status.thermal.duty, abs=0.1)
        assert _health(app.target, "appliance.v1.Inference") == health_pb2.HealthCheckResponse.SERVING
        capsys.readouterr()
        assert cli_main(["health", "--target", app.target]) == 1
        assert "WARNING" in capsys.readouterr().out
        _until(lambda: _status(app.target).thermal.seconds_above_limit > 0)


def test_read_errors_go_blind_and_fail_the_thermal_health_name(models_dir: Path) -> None:
    nvml = FakePynvml(temperature=60)
    with nvml_app(models_dir, nvml) as app:
        nvml.fail["nvmlDeviceGetTemperatureV"] = nvml.NVML_ERROR_TIMEOUT
        nvml.fail["nvmlDeviceGetTemperature"] = nvml.NVML_ERROR_TIMEOUT
        _until(lambda: _status(app.target).thermal.state == "BLIND", 15)
        status = _status(app.target)
        assert status.thermal.sensor_errors > 0
        assert status.thermal.duty <= ThermalConfig().blind_duty + 1e-6
        _until(lambda: _health(app.target, "appliance.thermal") == health_pb2.HealthCheckResponse.NOT_SERVING)
        assert _health(app.target, "appliance.v1.Inference") == health_pb2.HealthCheckResponse.SERVING
        assert cli_main(["health", "--target", app.target]) == 1


def test_lost_gpu_stops_dispatch_and_not_serving(models_dir: Path) -> None:
    nvml = FakePynvml(temperature=60)
    with nvml_app(models_dir, nvml) as app:
        nvml.fail["nvmlDeviceGetTemperatureV"] = nvml.NVML_ERROR_GPU_IS_LOST
        _until(lambda: _status(app.target).thermal.state == "STOPPED")
        assert app.app.pacer.duty == 0.0
        _until(lambda: _health(app.target, "appliance.v1.Inference") == health_pb2.HealthCheckResponse.NOT_SERVING)
        with grpc.insecure_channel(app.target) as ch:
            data = synthetic.to_dicom(synthetic.generate_slice(5, size=512))
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=data), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "thermal" in e.value.details()
        assert cli_main(["health", "--target", app.target]) == 2


def test_serve_thermal_sim_reports_the_plant(models_dir: Path) -> None:
    cfg = fake_config(models_dir, thermal={"sensor": "sim", "period_s": 0.05})
    app = RunningApp(cfg, notifier=RecordingNotifier())
    try:
        _until(lambda: _status(app.target).thermal.temperature_c > 0)
        status = _status(app.target)
        assert status.thermal.enabled and status.thermal.state in ("COOL", "REGULATING")
        with grpc.insecure_channel(app.target) as ch:
            data = synthetic.to_dicom(synthetic.generate_slice(6, size=512))
            assert pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=data), timeout=10).frames
    finally:
        app.stop()


def test_lost_gpu_answers_queued_work_and_stops_the_watchdog(models_dir: Path) -> None:
    nvml = FakePynvml(temperature=60)
    slow_engine = {"options": {"latency_s": 2.0}}  # the first batch holds the engine
    with nvml_app(models_dir, nvml, engine=slow_engine) as app:
        assert app.app._heartbeat() > 0
        with grpc.insecure_channel(app.target) as ch:
            data = synthetic.to_dicom(synthetic.generate_slice(7, size=512))
            stub = pb_grpc.InferenceStub(ch)
            running = stub.Analyze.future(pb.AnalyzeRequest(dicom=data), timeout=20)
            _until(lambda: len(app.app.engine.batches) == 1, 5)  # recorded as it starts: the engine is busy
            queued = stub.Analyze.future(pb.AnalyzeRequest(dicom=data), timeout=20)
            _until(lambda: app.app.batcher.statistics().depth == 1, 5)
            nvml.fail["nvmlDeviceGetTemperatureV"] = nvml.NVML_ERROR_GPU_IS_LOST
            with pytest.raises(grpc.RpcError) as e:
                queued.result()
            running.result()  # the batch already on the engine finishes
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert app.app._heartbeat() == float("-inf")  # WATCHDOG=1 stops: systemd restarts the service


def test_a_read_that_hangs_is_a_failed_read_and_the_pacer_goes_blind(models_dir: Path) -> None:
    """Held-out review, session 19: the loop awaited each read without a bound, so an NVML call that hung kept the
    pacer at its last duty (full, on a cool start) until the watchdog fired some 45 s later; on a hot plant the die
    reached 78.5 °C. A read that has not answered within its period is now a failed read: HOLDING, then BLIND."""
    nvml = FakePynvml(temperature=55)
    with nvml_app(models_dir, nvml) as app:
        assert _status(app.target).thermal.duty == 1.0
        gate = threading.Event()
        before = nvml.calls.count("nvmlDeviceGetTemperatureV")
        nvml.block["nvmlDeviceGetTemperatureV"] = gate  # the next read does not answer
        try:
            _until(lambda: _status(app.target).thermal.state == "BLIND", 15)
            status = _status(app.target)
            assert status.thermal.duty <= ThermalConfig().blind_duty + 1e-6
            assert app.app.pacer.duty <= ThermalConfig().blind_duty + 1e-6
            assert _health(app.target, "appliance.v1.Inference") == health_pb2.HealthCheckResponse.SERVING
            assert _health(app.target, "appliance.thermal") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert nvml.calls.count("nvmlDeviceGetTemperatureV") - before == 1  # no second read piles up behind it
        finally:
            gate.set()
        del nvml.block["nvmlDeviceGetTemperatureV"]
        _until(lambda: _status(app.target).thermal.state != "BLIND", 20)  # it answers again: recovers
