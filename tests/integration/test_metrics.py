"""Prometheus metrics: on by default at 127.0.0.1:9400, served before READY, Prometheus naming, and the
series the issue asks for (latency per stage, status, rejections, queue, batches, engine, thermal, workers)."""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.config import MetricsConfig
from appliance.errors import ConfigError
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.metrics import LATENCY_BUCKETS, Metrics, parse_listen
from appliance.serving.notify import RecordingNotifier
from appliance.tools import synthetic
from tests.oip_support import dicom_infer_request
from tests.support import RunningApp, fake_config

#: every family the dashboard and docs/monitoring.md rely on, with its Prometheus type
REQUIRED = {
    "appliance_stage_duration_seconds": "histogram",
    "appliance_requests": "counter",
    "appliance_rejections": "counter",
    "appliance_queue_depth": "gauge",
    "appliance_queue_capacity": "gauge",
    "appliance_batches": "counter",
    "appliance_jpeg2000_lowpass_frames": "counter",
    "appliance_batch_slots": "counter",
    "appliance_padded_slots": "counter",
    "appliance_batch_fill_ratio": "gauge",
    "appliance_engine_busy_seconds": "counter",
    "appliance_gpu_temperature_celsius": "gauge",
    "appliance_gpu_power_watts": "gauge",
    "appliance_thermal_duty_ratio": "gauge",
    "appliance_thermal_state": "gauge",
    "appliance_thermal_above_limit_seconds": "counter",
    "appliance_thermal_sensor_errors": "counter",
    "appliance_decoder_worker_restarts": "counter",
    "appliance_build_info": "gauge",  # an Info: exposed as a gauge of 1 with the labels
    "appliance_serving": "gauge",
}


@dataclass
class Snap:  # the fields of appliance.thermal_control.ThermalStatus that metrics read
    temperature_c: float | None
    duty: float
    state: str
    seconds_above_limit: float
    sensor_errors: int
    power_w: float | None = None


def scrape(address: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        assert r.headers.get_content_type() == "text/plain"
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {sample}{labels}")


def test_on_by_default_on_loopback_9400() -> None:
    assert MetricsConfig().listen == "127.0.0.1:9400"
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen(":9400") == ("127.0.0.1", 9400)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9400", "host:port", "127.0.0.1:70000"):
        with pytest.raises(ConfigError, match="metrics.listen"):
            parse_listen(bad)


def test_buckets_are_dense_around_the_100ms_budget() -> None:
    near = [b for b in LATENCY_BUCKETS if 0.05 <= b <= 0.15]
    assert len(near) >= 8 and 0.1 in LATENCY_BUCKETS
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)


def test_daemon_serves_every_series(models_dir: Path) -> None:
    app = RunningApp(fake_config(models_dir), notifier=RecordingNotifier())
    try:
        assert app.app.metrics_address.startswith("127.0.0.1:")
        data = synthetic.to_dicom(synthetic.generate_slice(5, size=512))
        with grpc.insecure_channel(app.target) as channel:
            pb_grpc.InferenceStub(channel).Analyze(pb.AnalyzeRequest(dicom=data), timeout=10)
        families = scrape(app.app.metrics_address)
        for name, kind in REQUIRED.items():
            assert name in families, name
            assert families[name].type == kind, (name, families[name].type)
        assert value(families, "appliance_requests", "appliance_requests_total", code="OK") == 1
        assert value(families, "appliance_rejections", "appliance_rejections_total", reason="QUEUE_FULL") == 0
        assert value(families, "appliance_rejections", "appliance_rejections_total", reason="SENDER_SHARE") == 0
        assert value(families, "appliance_batches", "appliance_batches_total") >= 1
        slots = value(families, "appliance_batch_slots", "appliance_batch_slots_total")
        padded = value(families, "appliance_padded_slots", "appliance_padded_slots_total")
        assert slots == 4 * value(families, "appliance_batches", "appliance_batches_total") and padded == slots - 1
        for stage in ("queue", "preprocess", "engine", "total"):
            count = value(
                families, "appliance_stage_duration_seconds", "appliance_stage_duration_seconds_count", stage=stage
            )
            assert count >= 1, stage
        le = value(
            families, "appliance_stage_duration_seconds", "appliance_stage_duration_seconds_bucket",
            stage="total", le="10.0",
        )  # fmt: skip
        assert le == 1
        info = value(families, "appliance_build_info", "appliance_build_info", model="ct-nodule", backend="fake")
        assert info == 1
        assert value(families, "appliance_thermal_state", "appliance_thermal_state", state="DISABLED") in (0, 1)
    finally:
        app.stop()
    with pytest.raises(OSError):  # stop() closes the endpoint
        urllib.request.urlopen(f"http://{app.app.metrics_address}/metrics", timeout=2)


def test_frames_decoded_at_half_resolution_are_counted(models_dir: Path) -> None:
    from pydicom.uid import JPEG2000Lossless

    app = RunningApp(fake_config(models_dir), notifier=RecordingNotifier())
    try:
        truth = synthetic.generate_slice(6, size=512)
        with grpc.insecure_channel(app.target) as channel:
            stub = pb_grpc.InferenceStub(channel)
            stub.Analyze(pb.AnalyzeRequest(dicom=synthetic.to_dicom(truth)), timeout=10)
            families = scrape(app.app.metrics_address)
            assert value(families, "appliance_jpeg2000_lowpass_frames", "appliance_jpeg2000_lowpass_frames_total") == 0
            j2k = synthetic.to_dicom(truth, transfer_syntax=JPEG2000Lossless)
            stub.Analyze(pb.AnalyzeRequest(dicom=j2k), timeout=10)  # the default pipeline: a full decode
            families = scrape(app.app.metrics_address)
            assert value(families, "appliance_jpeg2000_lowpass_frames", "appliance_jpeg2000_lowpass_frames_total") == 0
            stub.Analyze(pb.AnalyzeRequest(dicom=j2k, pipeline="ct-nodule-fast"), timeout=10)
        families = scrape(app.app.metrics_address)
        assert value(families, "appliance_jpeg2000_lowpass_frames", "appliance_jpeg2000_lowpass_frames_total") == 1
    finally:
        app.stop()


def _start_fails(config) -> ConfigError:  # noqa: ANN001
    from appliance.serving.app import App

    gate = threading.Event()  # never set: the engine would load forever, so failing proves it failed first
    app = App(config, notifier=RecordingNotifier(), engine_options={"load_gate": gate})
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ConfigError) as e:
            loop.run_until_complete(asyncio.wait_for(app.start(), 30))
        assert "READY=1" not in app.notifier.messages
        gate.set()
        loop.run_until_complete(app.stop(0.5))
    finally:
        loop.close()
    return e.value


def test_bad_or_taken_address_fails_the_start_before_ready(models_dir: Path) -> None:
    from appliance.errors import ConfigError

    with pytest.raises(ConfigError, match="metrics.listen"):  # refused when the config is loaded
        fake_config(models_dir, metrics={"listen": "127.0.0.1:http"})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _start_fails(fake_config(models_dir, metrics={"listen": f"127.0.0.1:{port}"}))
    assert "metrics.listen" in str(err) and str(port) in str(err)


def test_metrics_off_binds_nothing(models_dir: Path) -> None:
    app = RunningApp(fake_config(models_dir, metrics={"listen": ""}), notifier=RecordingNotifier())
    try:
        assert app.app.metrics_address == ""
    finally:
        app.stop()


def test_thermal_counters_grow_by_delta_and_state_is_one_hot() -> None:
    import math

    m = Metrics()
    assert math.isnan(m.registry.get_sample_value("appliance_gpu_temperature_celsius"))  # no reading yet: not 0 °C
    assert math.isnan(m.registry.get_sample_value("appliance_gpu_power_watts"))
    m.observe_thermal(Snap(71.5, 0.8, "THROTTLING", 2.0, 1, power_w=180.0))
    m.observe_thermal(Snap(None, 0.7, "HOLDING", 3.5, 3))
    m.observe_thermal(Snap(70.0, 0.7, "HOLDING", 3.5, 3))  # no change: no increment
    r = m.registry
    assert r.get_sample_value("appliance_thermal_above_limit_seconds_total") == 3.5
    assert r.get_sample_value("appliance_thermal_sensor_errors_total") == 3
    assert r.get_sample_value("appliance_gpu_temperature_celsius") == 70.0
    assert r.get_sample_value("appliance_gpu_power_watts") == 180.0
    assert r.get_sample_value("appliance_thermal_duty_ratio") == 0.7
    states = {s: r.get_sample_value("appliance_thermal_state", {"state": s}) for s in ("HOLDING", "THROTTLING", "COOL")}
    assert states == {"HOLDING": 1.0, "THROTTLING": 0.0, "COOL": 0.0}


def test_worker_restarts_rejections_and_batches() -> None:
    m = Metrics()
    m.on_worker_restart("crash")
    m.on_worker_restart("crash")
    m.on_worker_restart("hang")
    m.on_rejected("QUEUE_FULL")
    m.on_batch(3, 8, 0.04)
    r = m.registry
    assert r.get_sample_value("appliance_decoder_worker_restarts_total", {"reason": "crash"}) == 2
    assert r.get_sample_value("appliance_decoder_worker_restarts_total", {"reason": "hang"}) == 1
    assert r.get_sample_value("appliance_rejections_total", {"reason": "QUEUE_FULL"}) == 1
    assert r.get_sample_value("appliance_padded_slots_total") == 5
    assert r.get_sample_value("appliance_batch_slots_total") == 8
    assert r.get_sample_value("appliance_engine_busy_seconds_total") == pytest.approx(0.04)
    assert r.get_sample_value("appliance_stage_duration_seconds_bucket", {"stage": "engine", "le": "0.05"}) == 1


def test_oip_requests_are_counted_and_logged_including_those_it_refuses_itself(models_dir: Path, caplog) -> None:
    """Held-out review, session 14: an OIP request refused by the OIP layer (an FP16 input) was missing from
    appliance_requests_total, and no ModelInfer, successful or not, had a journal line."""
    import logging

    import numpy as np

    from appliance.proto.inference import grpc_service_pb2 as oip
    from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc

    app = RunningApp(fake_config(models_dir), notifier=RecordingNotifier())
    try:
        ok = oip.ModelInferRequest(model_name="ct-nodule", id="oip-ok")
        ok.inputs.add(name="image", datatype="FP32", shape=[1, 1, 256, 256])
        ok.raw_input_contents.append(np.zeros((1, 1, 256, 256), np.float32).tobytes())
        fp16 = oip.ModelInferRequest(model_name="ct-nodule", id="oip-fp16")
        fp16.inputs.add(name="image", datatype="FP16", shape=[1, 1, 256, 256])
        fp16.raw_input_contents.append(np.zeros((1, 1, 256, 256), np.float16).tobytes())
        with caplog.at_level(logging.INFO, logger="appliance.serving.oip"), \
                grpc.insecure_channel(app.target) as channel:
            stub = oip_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(ok, timeout=10)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(fp16, timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(oip.ModelInferRequest(model_name="no-such-model", id="oip-404"), timeout=10)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.RpcError) as e:  # a name that would forge the rest of the journal line
                stub.ModelInfer(oip.ModelInferRequest(model_name="ct-nodule x OK", id="oip-forged"), timeout=10)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        families = scrape(app.app.metrics_address)
        assert value(families, "appliance_requests", "appliance_requests_total", code="OK") == 1
        assert value(families, "appliance_requests", "appliance_requests_total", code="INVALID_ARGUMENT") == 1
        assert value(families, "appliance_requests", "appliance_requests_total", code="NOT_FOUND") == 2  # session 18
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ModelInfer ")]
        assert any("no-such-model oip-404 NOT_FOUND" in line for line in lines), lines
        assert any(line.startswith("ModelInfer - oip-forged NOT_FOUND") for line in lines), lines
        assert any("oip-ok OK" in line for line in lines) and any("oip-fp16 INVALID_ARGUMENT" in line
                                                                  for line in lines), lines
    finally:
        app.stop()


def test_a_multi_file_oip_request_is_counted_once_with_its_own_outcome(models_dir: Path) -> None:
    """Held-out review, session 18: one ModelInfer of 20 files, the last not DICOM, moved appliance_requests_total
    by OK +15, INVALID_ARGUMENT +1 and CANCELLED +4 (the abandoned siblings), though the client sent one request and
    cancelled nothing."""
    from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc

    good = synthetic.to_dicom(synthetic.generate_slice(5, size=256))
    app = RunningApp(fake_config(models_dir), notifier=RecordingNotifier())

    try:
        with grpc.insecure_channel(app.target) as channel:
            stub = oip_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(dicom_infer_request([good] * 3, "three"), timeout=30)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(dicom_infer_request([good] * 19 + [b"not dicom"], "twenty"), timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith("dicom[19]")
        families = scrape(app.app.metrics_address)
        counts = {s.labels["code"]: s.value for s in families["appliance_requests"].samples
                  if s.name == "appliance_requests_total"}
        assert counts == {"OK": 1, "INVALID_ARGUMENT": 1}, counts
    finally:
        app.stop()
