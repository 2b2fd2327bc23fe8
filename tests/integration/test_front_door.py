"""The front door against a real daemon (worker processes, real DICOM, fake engine): every hostile input ends
with an expected status and a message, a crashing, panicking, hoarding or spinning decoder costs only its own
item, a slow bomb does not stall valid requests, and the daemon is healthy at the end (docs/robustness.md)."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import RecordingNotifier
from appliance.tools import synthetic
from appliance.tools.chaos import ANY_PIPELINE, bad_cases, fault_case
from tests.oip_support import dicom_infer_request
from tests.support import OWN_CONNECTION, REPO, RunningApp, fake_config, write_fake_model

CASES = bad_cases(seed=0)
FAULT_KINDS = ("segfault", "abort", "panic", "alloc", "spin", "exit")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("frontdoor")
    models = root / "models"
    write_fake_model(models, batch=8, h=256, w=256, name="ct-nodule", heatmap=16)
    pipes = root / "pipelines"
    pipes.mkdir()
    for name in ("ct-nodule.toml", "ct-nodule-fast.toml"):
        (pipes / name).write_text((REPO / "pipelines" / name).read_text())
    (pipes / "any.toml").write_text(ANY_PIPELINE)
    mp = pytest.MonkeyPatch()
    mp.setenv("APPLIANCE_TEST_DECODER_FAULTS", "1")
    config = fake_config(
        models,
        model={"pipelines_dir": str(pipes)},
        batcher={"max_wait_s": 0.0, "preprocess_workers": 2},
        workers={"step_timeout_s": 2.0, "memory_bytes": 256 << 20},
    )
    app = RunningApp(config, notifier=RecordingNotifier())
    mp.undo()
    with grpc.insecure_channel(app.target, options=[("grpc.max_send_message_length", 128 << 20)]) as ch:
        yield app, ch
    app.stop()


def _analyze(channel: grpc.Channel, data: bytes, pipeline: str = "", timeout: float = 30.0) -> tuple[str, str]:
    try:
        pb_grpc.InferenceStub(channel).Analyze(pb.AnalyzeRequest(dicom=data, pipeline=pipeline), timeout=timeout)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""
    return "OK", ""


VALID = synthetic.to_dicom(synthetic.generate_slice(11, size=256))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_its_expected_status(server, case) -> None:
    _, channel = server
    code, message = _analyze(channel, case.data, case.pipeline)
    assert code in case.expect, f"{case.name}: {code} {message}"
    if code != "OK":
        assert message, "a rejection without a message"


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_crashing_decoder_costs_only_its_item(server, kind: str) -> None:
    app, channel = server
    before = app.app.pool.statistics().restarts
    case = fault_case(kind)
    code, message = _analyze(channel, case.data)
    assert code in case.expect, f"{kind}: {code} {message}"
    assert message
    assert _analyze(channel, VALID) == ("OK", "")  # the next request is served
    after = app.app.pool.statistics().restarts
    if kind in ("segfault", "abort", "spin", "exit"):  # the process died or was killed: replaced and counted
        assert after == before + 1
        status = pb_grpc.InferenceStub(channel).GetStatus(pb.GetStatusRequest())
        assert status.worker_restarts == after
    elif "time budget" not in message:  # a panic and MemoryError are answered by the living worker (unless a
        assert after == before  # loaded machine made the hoarding outlast the step budget: then it was killed)


def test_slow_bomb_does_not_stall_valid_requests(server) -> None:
    _, channel = server
    spin = fault_case("spin")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        bombs = [pool.submit(_analyze, channel, spin.data, "", 20.0) for _ in range(1)]
        time.sleep(0.2)  # the bomb holds one worker
        t0 = time.monotonic()
        results = [_analyze(channel, VALID, timeout=1.5) for _ in range(10)]
        elapsed = time.monotonic() - t0
        assert results == [("OK", "")] * 10, results
        assert elapsed < 15
        assert bombs[0].result()[0] in spin.expect


def test_a_flood_from_one_client_does_not_hold_back_another(server) -> None:
    """Senders take turns for the workers (docs/robustness.md): six slow bombs queued by one client, then one
    valid file from another client; the valid file gets the first worker that frees, not the seventh."""
    app, _ = server
    spin = fault_case("spin")  # holds its worker for the whole 2 s step budget, then the worker is replaced
    own = OWN_CONNECTION
    with grpc.insecure_channel(app.target, options=own) as flooder, \
            grpc.insecure_channel(app.target, options=own) as other, \
            concurrent.futures.ThreadPoolExecutor(8) as pool:

        def timed(channel: grpc.Channel, data: bytes) -> tuple[float, tuple[str, str]]:
            result = _analyze(channel, data, "", 30.0)
            return time.monotonic(), result

        bombs = [pool.submit(timed, flooder, spin.data) for _ in range(6)]
        deadline = time.monotonic() + 10
        while app.app.pool.statistics().queued < 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # two bombs on the workers, four waiting for one
        assert app.app.pool.statistics().queued >= 4
        valid_done, valid = timed(other, VALID)
        finished = sorted(b.result()[0] for b in bombs)
    assert valid == ("OK", "")
    assert all(b.result()[1][0] in spin.expect for b in bombs)
    # in one queue it would have waited for all six bombs to start; taking turns, for the first two only
    assert valid_done < finished[2], (valid_done, finished)


def test_healthy_after_everything(server) -> None:
    app, channel = server
    r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="appliance.v1.Inference"))
    assert r.status == health_pb2.HealthCheckResponse.SERVING
    status = pb_grpc.InferenceStub(channel).GetStatus(pb.GetStatusRequest())
    assert status.status_counts.get("INTERNAL", 0) == 0
    assert status.status_counts.get("UNKNOWN", 0) == 0
    deadline = time.monotonic() + 20
    while app.app.pool.statistics().workers < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # a worker killed by the last test is being replaced
    assert app.app.pool.statistics().workers == 2
    assert app.app.batcher.statistics().depth == 0  # no slot leaked


def test_arena_file_is_removed_on_stop(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    app = RunningApp(fake_config(models), notifier=RecordingNotifier())
    path = app.app.arena.path
    assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
    assert _analyze_target(app.target) == "OK"
    app.stop()
    assert not path.exists()


def _analyze_target(target: str) -> str:
    with grpc.insecure_channel(target) as ch:
        return _analyze(ch, VALID)[0]


def test_inflight_byte_budget_is_taken_before_a_worker_sees_the_payload(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    big = synthetic.to_dicom(synthetic.generate_slice(2, size=512))  # ~0.5 MB
    config = fake_config(models, server={"max_message_bytes": 1 << 20, "inflight_bytes": 1 << 20},
                         engine={"options": {"latency_s": 0.3}})
    app = RunningApp(config, notifier=RecordingNotifier())
    try:
        with grpc.insecure_channel(app.target) as ch, concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: _analyze(ch, big), range(4)))
        codes = [code for code, _ in results]
        assert "OK" in codes
        refused = [msg for code, msg in results if code == "RESOURCE_EXHAUSTED"]
        assert refused and all("server.inflight_bytes" in m for m in refused), results
    finally:
        app.stop()


def test_an_arena_left_by_a_killed_daemon_is_removed(tmp_path: Path) -> None:
    import subprocess
    import sys

    from appliance.workers.arena import SlotArena, _shm_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = _shm_dir() / f"edge-appliance-{int(dead.stdout)}-deadbeef.slots"
    stale.write_bytes(b"\\0" * 16)
    arena = SlotArena.create(2, (1, 4, 4))
    try:
        assert not stale.exists()
        assert arena.path.exists()
    finally:
        arena.close()


def test_requests_waiting_for_a_worker_are_bounded_like_the_inbox(tmp_path: Path) -> None:
    """Admission stays explicit: past queue_capacity requests waiting for a worker (and slots), the answer is
    RESOURCE_EXHAUSTED at once instead of a queue that grows for seconds."""
    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    config = fake_config(models, batcher={"queue_capacity": 4, "preprocess_workers": 2},
                         engine={"options": {"latency_s": 0.3}})
    app = RunningApp(config, notifier=RecordingNotifier())
    try:
        with grpc.insecure_channel(app.target) as ch, concurrent.futures.ThreadPoolExecutor(40) as pool:
            results = list(pool.map(lambda _: _analyze(ch, VALID), range(40)))
        codes = [code for code, _ in results]
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, results
        assert "OK" in codes and "RESOURCE_EXHAUSTED" in codes
        assert app.app.batcher.statistics().rejected > 0  # counted like any other refusal
    finally:
        app.stop()


def test_a_client_flooding_the_queue_leaves_room_for_another(tmp_path: Path) -> None:
    """While another client is active, a sender that already has requests in flight is refused at SENDER_SHARE of
    batcher.queue_capacity, so the other client still gets in (and, taking turns, gets the first free worker)."""
    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    mp = pytest.MonkeyPatch()
    mp.setenv("APPLIANCE_TEST_DECODER_FAULTS", "1")
    config = fake_config(models, batcher={"queue_capacity": 8, "preprocess_workers": 2, "max_wait_s": 0.0},
                         workers={"step_timeout_s": 1.0})
    app = RunningApp(config, notifier=RecordingNotifier())
    mp.undo()
    spin = fault_case("spin")
    own = OWN_CONNECTION
    try:
        with grpc.insecure_channel(app.target, options=own) as flooder, \
                grpc.insecure_channel(app.target, options=own) as other, \
                concurrent.futures.ThreadPoolExecutor(16) as pool:
            bombs = [pool.submit(_analyze, flooder, spin.data, "", 30.0) for _ in range(6)]
            deadline = time.monotonic() + 10
            while app.app.pool.statistics().queued < 4 and time.monotonic() < deadline:
                time.sleep(0.01)  # two bombs on the workers, four waiting: alone, the flooder may fill all 8
            valid = pool.submit(_analyze, other, VALID, "", 20.0)  # another client arrives
            deadline = time.monotonic() + 10
            # until the other client's request is in the server (the 6 bombs and it): unadmitted() also counts a
            # bomb being parsed, so it could pass 5 before that request arrived and the next bombs overtook it
            while app.app.path.in_flight < 7 and time.monotonic() < deadline:
                time.sleep(0.01)
            more = [pool.submit(_analyze, flooder, spin.data, "", 30.0) for _ in range(6)]  # now held to its share
            results = [b.result() for b in bombs + more]
            assert valid.result() == ("OK", "")
        refused = [msg for code, msg in results if code == "RESOURCE_EXHAUSTED" and "preprocessing worker" in msg]
        assert refused and all("kept for other senders" in m for m in refused), results
        assert all(code in spin.expect or code == "RESOURCE_EXHAUSTED" for code, _ in results), results
    finally:
        app.stop()


def _multiframe(frames: int, seed: int) -> bytes:
    import io

    import numpy as np
    import pydicom

    ds = pydicom.dcmread(io.BytesIO(synthetic.to_dicom(synthetic.generate_slice(seed, size=256))))
    pixels = ds.pixel_array
    ds.NumberOfFrames = frames
    ds.PixelData = np.stack([pixels] * frames).astype(pixels.dtype).tobytes()
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def test_the_files_of_one_oip_request_wait_for_each_other_instead_of_refusing_each_other(tmp_path: Path) -> None:
    """Held-out review, session 18: two 33-frame files in one ModelInfer, from an otherwise idle client, were refused
    RESOURCE_EXHAUSTED "inbox full: 33 of 64 slots in use" by each other, at random. They now share one frame
    window, as the items of one AnalyzeStream do."""
    from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc

    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    config = fake_config(models, batcher={"queue_capacity": 16}, engine={"options": {"latency_s": 0.05}})
    app = RunningApp(config, notifier=RecordingNotifier())
    files = [_multiframe(9, 3), _multiframe(9, 4)]  # 18 frames: each file fits the 16-slot inbox, both do not
    try:
        with grpc.insecure_channel(app.target) as ch:
            stub = oip_grpc.GRPCInferenceServiceStub(ch)
            for attempt in range(3):
                response = stub.ModelInfer(dicom_infer_request(files, f"two-{attempt}"), timeout=30)
                shapes = {o.name: list(o.shape) for o in response.outputs}
                assert shapes["file_index"] == [18] and shapes["frame_index"] == [18]
    finally:
        app.stop()


def test_a_tensor_with_nan_names_the_input_and_the_row(tmp_path: Path) -> None:
    """Held-out review, session 18: the error said only "input contains NaN or infinity"."""
    import numpy as np

    from appliance.proto.inference import grpc_service_pb2 as oip
    from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc

    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    app = RunningApp(fake_config(models), notifier=RecordingNotifier())
    x = np.zeros((3, 1, 256, 256), np.float32)
    x[1, 0, 7, 9] = np.nan
    request = oip.ModelInferRequest(model_name="ct-nodule", id="nan")
    request.inputs.add(name="image", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    try:
        with grpc.insecure_channel(app.target) as ch, pytest.raises(grpc.RpcError) as e:
            oip_grpc.GRPCInferenceServiceStub(ch).ModelInfer(request, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 'image' row 1 contains NaN or infinity (1 of 3 rows do)" in e.value.details()
    finally:
        app.stop()


def test_the_files_of_one_oip_request_share_one_message_size_limit(tmp_path: Path) -> None:
    """Held-out review, session 18: two files of 32.3 MiB in one ModelInfer passed where one of 64.2 MiB was refused;
    server.max_message_bytes bounds one request's DICOM bytes, as for Analyze."""
    from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc

    models = tmp_path / "models"
    write_fake_model(models, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    app = RunningApp(fake_config(models, server={"max_message_bytes": 200_000}), notifier=RecordingNotifier())
    one = synthetic.to_dicom(synthetic.generate_slice(3, size=256))  # about 131 KB

    try:
        with grpc.insecure_channel(app.target) as ch:
            stub = oip_grpc.GRPCInferenceServiceStub(ch)
            stub.ModelInfer(dicom_infer_request([one]), timeout=10)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(dicom_infer_request([one, one]), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        needle = f"request of {2 * len(one)} bytes of DICOM in 2 files exceeds server.max_message_bytes = 200000"
        assert needle in e.value.details(), e.value.details()
    finally:
        app.stop()
