"""The bundled model end to end: the default config (ONNX Runtime on the CPU, INT4 artifact) serves it over
gRPC, and scores of generated slices make sense."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from appliance.config import load_config
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import RecordingNotifier
from appliance.tools import synthetic
from tests.support import RunningApp

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def server():
    cfg = load_config(
        None, {"server": {"listen": ["127.0.0.1:0"]}, "thermal": {"sensor": "none"}, "metrics": {"listen": ""}}
    )
    app = RunningApp(cfg, notifier=RecordingNotifier())
    with grpc.insecure_channel(app.target) as channel:
        yield app, pb_grpc.InferenceStub(channel)
    app.stop()


def test_default_engine_is_the_cpu_int4_artifact(server) -> None:
    _, stub = server
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert status.model.name == "ct-nodule"
    assert status.model.precision == "int4"
    assert status.model.backend == "onnxruntime:CPUExecutionProvider"
    assert status.model.batch_size == 8


def test_scores_separate_positive_from_negative_slices(server) -> None:
    _, stub = server
    pos = [synthetic.generate_slice(9000 + i, nodule=True, min_diameter_mm=12.0, size=512) for i in range(6)]
    neg = [synthetic.generate_slice(9100 + i, nodule=False, size=512) for i in range(6)]
    requests = [pb.AnalyzeRequest(dicom=synthetic.to_dicom(t), request_id=f"p{i}") for i, t in enumerate(pos)]
    requests += [pb.AnalyzeRequest(dicom=synthetic.to_dicom(t), request_id=f"n{i}") for i, t in enumerate(neg)]
    replies = {r.request_id: r for r in stub.AnalyzeStream(iter(requests), timeout=60)}
    score = {
        k: r.frames[0].findings[0].score
        if r.frames[0].findings[0].label == "nodule"
        else 1 - r.frames[0].findings[0].score
        for k, r in replies.items()
    }
    pos_scores = [score[f"p{i}"] for i in range(6)]
    neg_scores = [score[f"n{i}"] for i in range(6)]
    assert np.mean(pos_scores) > 0.5 > np.mean(neg_scores), (pos_scores, neg_scores)
    # large nodules are localised: the map's peak lies within a few cells of the nodule
    hits = 0
    for i, truth in enumerate(pos):
        loc = replies[f"p{i}"].frames[0].location
        near = [np.hypot(loc.row - r, loc.column - c) for r, c, _d, _hu in truth.nodules]
        hits += min(near) < 64
    assert hits >= 4


def test_a_lone_request_runs_on_the_burst_threads(server) -> None:
    app, stub = server
    engine = app.app.engine.chosen  # behind backend = "auto"
    before = engine.burst_batches
    data = synthetic.to_dicom(synthetic.generate_slice(9200, size=512))
    for _ in range(3):  # one client, one slice at a time: nothing else to preprocess while its batch runs
        stub.Analyze(pb.AnalyzeRequest(dicom=data), timeout=30)
    assert engine.burst_batches - before >= 2
