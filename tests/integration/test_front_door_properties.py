"""Property-based front door (hypothesis): random mutations of valid files in every transfer syntax, sent to a
real daemon, end with an allowed status and a message; never INTERNAL, never a hang; healthy at the end."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import RecordingNotifier
from appliance.tools.chaos import valid_files
from tests.support import RunningApp, fake_config, write_fake_model

VALID = valid_files(size=64, seed=3)
ALLOWED = {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory):
    models = tmp_path_factory.mktemp("models")
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    config = fake_config(models, batcher={"max_wait_s": 0.0, "preprocess_workers": 2},
                         workers={"step_timeout_s": 5.0})
    app = RunningApp(config, notifier=RecordingNotifier())
    with grpc.insecure_channel(app.target) as ch:
        yield ch
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    app.stop()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID[draw(st.sampled_from(sorted(VALID)))])
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "delete", "insert"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        if not data:
            break
    return bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=mutated())
def test_mutated_file_ends_with_an_allowed_status(channel, data: bytes) -> None:
    try:
        pb_grpc.InferenceStub(channel).Analyze(pb.AnalyzeRequest(dicom=data), timeout=20)
    except grpc.RpcError as e:
        assert e.code().name in ALLOWED, f"{e.code().name}: {e.details()}"
        assert e.details()
