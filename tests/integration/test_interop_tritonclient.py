"""tritonclient.grpc (a Triton user's client, in its own venv) against our Open Inference Protocol server.

The client script runs in a side venv (tritonclient needs protobuf<7; tests/interop/venvs.py). The server is
whatever ``oip_target`` yields: today a loopback grpc.aio server over the FakeAnalyzer with the fake engine;
pointing it at ``appliance serve`` (fake engine) must give the same results.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest

from appliance.batching.work import Priority
from appliance.proto.inference import grpc_service_pb2 as oip
from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc
from appliance.tools import synthetic
from tests.interop import venvs
from tests.interop.daemon import appliance_serve
from tests.oip_support import LoopbackOip

SCRIPT = Path(__file__).resolve().parents[1] / "interop" / "triton_client_check.py"
PRE = {"window_center": -600.0, "window_width": 1500.0, "size": (256, 256)}


@pytest.fixture(scope="module")
def tritonclient_python() -> Path:
    try:
        return venvs.ensure("tritonclient", timeout_s=240)  # under pytest-timeout: skip, not fail
    except venvs.VenvUnavailable as e:
        pytest.skip(f"tritonclient side venv unavailable: {e}")


@pytest.fixture(scope="module", params=["loopback", "daemon"])
def oip_target(request: pytest.FixtureRequest, models_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(address, loopback server or None) serving ct-nodule (fake engine, B=4) over the OIP.

    ``loopback``: the servicer over the FakeAnalyzer. ``daemon``: a real `appliance serve` (worker processes,
    batcher, fake engine) must pass the same checks.
    """
    if request.param == "loopback":
        server = LoopbackOip(models_dir)
        yield server.address, server
        server.stop()
        return
    with appliance_serve(tmp_path_factory.mktemp("oip-daemon")) as target:
        with grpc.insecure_channel(target) as channel:
            assert oip_grpc.GRPCInferenceServiceStub(channel).ServerLive(oip.ServerLiveRequest(), timeout=5).live
        yield target, None


def fake_engine_outputs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fake engine's documented outputs: prob = mean of the item, heatmap = 16x16 average pooling."""
    return x.reshape(len(x), -1).mean(axis=1, keepdims=True), x.reshape(len(x), 16, 16, 16, 16).mean(axis=(2, 4))


def test_tritonclient_health_metadata_and_both_views(tritonclient_python: Path, oip_target, tmp_path: Path) -> None:
    address, loopback = oip_target
    x = np.random.default_rng(7).random((4, 1, 256, 256), dtype=np.float32)
    np.save(tmp_path / "tensor.npy", x)
    truths = [synthetic.generate_slice(seed, nodule=seed % 2 == 0, size=512) for seed in (30, 31, 32)]
    for i, truth in enumerate(truths):
        (tmp_path / f"dicom_{i}.dcm").write_bytes(synthetic.to_dicom(truth))

    proc = subprocess.run(
        [str(tritonclient_python), str(SCRIPT), address, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert proc.returncode == 0, result.get("error") or proc.stderr[-3000:]
    arrays = np.load(tmp_path / "result.npz", allow_pickle=False)

    # health and metadata
    assert result["live"] and result["ready"]
    assert result["model_ready"] == {"ct-nodule": True, "ct-nodule-dicom": True, "nope": False}
    assert "statistics" in result["server_metadata"]["extensions"]
    tensor_meta = result["metadata"]["ct-nodule"]
    assert tensor_meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": ["-1", "1", "256", "256"]}]
    assert [o["name"] for o in result["metadata"]["ct-nodule-dicom"]["outputs"]] == [
        "prob",
        "heatmap",
        "label",
        "score",
        "file_index",
        "frame_index",
        "lossy",
    ]
    config = result["config"]["ct-nodule"]["config"]
    assert config["max_batch_size"] == 4 and config["input"][0]["data_type"] == "TYPE_FP32"
    assert result["config"]["ct-nodule-dicom"]["config"]["input"][0]["data_type"] == "TYPE_STRING"

    # the tensor view: numerically the fake engine's outputs for these rows
    prob, heat = fake_engine_outputs(x)
    np.testing.assert_allclose(arrays["tensor_prob"], prob, rtol=1e-6)
    np.testing.assert_allclose(arrays["tensor_heatmap"], heat, rtol=1e-5)
    assert result["tensor_response"]["id"] == "tc-1"

    # the DICOM view: the same preprocessing as serving, one row per file
    expected = np.stack([synthetic.model_input(t, PRE) for t in truths])
    prob, heat = fake_engine_outputs(expected)
    np.testing.assert_allclose(arrays["dicom_prob"], prob, atol=1e-5)
    np.testing.assert_allclose(arrays["dicom_heatmap"], heat, atol=1e-5)
    assert arrays["dicom_file_index"].tolist() == [0, 1, 2]
    assert arrays["dicom_lossy"].dtype == np.bool_ and arrays["dicom_lossy"].tolist() == [False, False, False]
    assert result["dicom_labels"] == ["nodule" if p >= 0.5 else "no_nodule" for p in prob[:, 0]]

    assert result["unknown_model_error"]["status"] == "StatusCode.NOT_FOUND"
    stats = {s["name"]: s for s in result["statistics"]["model_stats"]}
    assert int(stats["ct-nodule"]["inference_count"]) >= 4 and int(stats["ct-nodule-dicom"]["inference_count"]) >= 3

    if loopback is not None:  # Triton's priority=1 / timeout (µs) reached the request path
        call = next(c for c in loopback.analyzer.calls if c.request_id == "tc-1")
        assert call.priority == Priority.INTERACTIVE
        assert call.time_remaining is not None and 0 < call.time_remaining <= 5.0
