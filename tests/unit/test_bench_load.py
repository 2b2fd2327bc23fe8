"""The bench's measurement parts: load patterns, the KServe v2 client, CPU accounting, FLOPs, the report.

Behaviour only (counts, shapes, arithmetic, what the wire carries), never speed. The real Triton peer needs its
own venv (bench/peers/triton/setup.sh) and is exercised by `make bench`, not here.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from appliance.serving.kserve_v2 import KServeV2, encode_bytes_tensor
from appliance.serving.notify import RecordingNotifier
from appliance.tools import benchcost as bc
from appliance.tools import loadgen, synthetic
from appliance.tools.bench import main as bench_main
from tests.support import RunningApp, fake_config


@pytest.fixture(scope="module")
def app(models_dir: Path):
    running = RunningApp(fake_config(models_dir), notifier=RecordingNotifier())
    yield running
    running.stop()


@pytest.fixture(scope="module")
def files() -> list[bytes]:
    return synthetic.workload("native", 4, seed=5)


def _run(coro):  # noqa: ANN001, ANN202
    return asyncio.run(coro)


async def _with_sender(target: str, files: list[bytes], fn):  # noqa: ANN001, ANN202
    async with grpc.aio.insecure_channel(target, options=loadgen.CHANNEL_OPTIONS) as ch:
        return await fn(loadgen.appliance_sender(ch, files))


def test_closed_loop_answers_exactly_the_requested_count(app: RunningApp, files: list[bytes]) -> None:
    res = _run(_with_sender(app.target, files, lambda s: loadgen.closed_loop(s, len(files), concurrency=3,
                                                                              requests=10)))
    summary = res.summary()
    assert summary["requests"] == 10 and summary["errors"] == {}
    assert len(res.latencies) == 10 and set(res.scores) == set(range(len(files)))
    assert all(0.0 <= v <= 1.0 for v in res.scores.values())
    lat = summary["latency_ms"]
    assert lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] and lat["jitter"] >= 1.0


def test_poisson_is_open_loop_and_seeded(app: RunningApp, files: list[bytes]) -> None:
    res = _run(_with_sender(app.target, files, lambda s: loadgen.poisson(s, len(files), rate_per_s=40.0,
                                                                          duration_s=0.5, seed=3)))
    again = np.cumsum(np.random.default_rng([3, 23]).exponential(1 / 40.0, size=20))
    assert res.offered == int((again < 0.5).sum())  # the arrival times are a function of the seed
    assert len(res.latencies) == res.offered and not res.errors
    assert res.elapsed_s >= 0.5


def test_bursts_report_one_drain_time_per_burst(app: RunningApp, files: list[bytes]) -> None:
    res, drain = _run(_with_sender(app.target, files, lambda s: loadgen.bursts(s, len(files), size=5,
                                                                                period_s=0.3, count=2)))
    assert res.offered == 10 and len(res.latencies) == 10
    assert len(drain) == 2 and all(d > 0 for d in drain)
    assert max(drain) == pytest.approx(max(res.latencies), abs=0.01)


def test_latency_summary_of_nothing_is_zero() -> None:
    assert loadgen.latency_summary([])["p99"] == 0.0


def test_kserve_client_sends_a_length_prefixed_bytes_tensor() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from appliance.proto.inference import grpc_service_pb2 as oip
    from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc

    seen: dict[str, object] = {}

    class Servicer(oip_grpc.GRPCInferenceServiceServicer):
        def ServerReady(self, request, context):  # noqa: ANN001, ANN201, N802
            return oip.ServerReadyResponse(ready=True)

        def ModelReady(self, request, context):  # noqa: ANN001, ANN201, N802
            return oip.ModelReadyResponse(ready=request.name == "ct-nodule")

        def ModelInfer(self, request, context):  # noqa: ANN001, ANN201, N802
            seen["model"] = request.model_name
            seen["inputs"] = [(t.name, t.datatype, list(t.shape)) for t in request.inputs]
            raw = request.raw_input_contents[0]
            (n,) = struct.unpack_from("<I", raw, 0)
            seen["payload"] = raw[4:4 + n]
            seen["trailing"] = len(raw) - 4 - n
            resp = oip.ModelInferResponse(model_name=request.model_name)
            resp.outputs.add(name="prob", datatype="FP32", shape=[1, 1])
            resp.raw_output_contents.append(np.asarray([0.25], dtype=np.float32).tobytes())
            return resp

    server = grpc.server(ThreadPoolExecutor(2))
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        async def go():  # noqa: ANN202
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                client = KServeV2(ch, "ct-nodule")
                return await client.ready(), await client.infer_dicom(b"DICM-bytes\x00\x01")

        ok, out = asyncio.run(go())
    finally:
        server.stop(0)
    assert ok
    assert seen == {"model": "ct-nodule", "inputs": [("dicom", "BYTES", [1, 1])], "payload": b"DICM-bytes\x00\x01",
                    "trailing": 0}
    assert out["prob"].shape == (1, 1) and out["prob"][0, 0] == np.float32(0.25)
    assert encode_bytes_tensor([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


def test_process_tree_cpu_counts_children() -> None:
    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\ntime.sleep(5)\n"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',{burn!r}]); "
                               "time.sleep(5)"])
    try:
        deadline = time.monotonic() + 4
        cpu: dict[int, float] = {}
        while time.monotonic() < deadline:
            cpu = bc.proc_tree_cpu_s(parent.pid)
            if len(cpu) == 2 and max(cpu.values()) >= 0.25:
                break
            time.sleep(0.1)
        assert len(cpu) == 2 and max(cpu.values()) >= 0.25  # the child's CPU, not only the parent's
        assert bc.cpu_delta_s({p: 0.0 for p in cpu}, cpu) == pytest.approx(sum(cpu.values()))
        assert bc.proc_tree_switches(parent.pid) > 0
        assert any(k.startswith("python") for k in bc.thread_cpu_s(parent.pid))
    finally:
        for pid in bc.proc_tree_cpu_s(parent.pid):
            if pid != parent.pid:
                os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_ceilings_arithmetic() -> None:
    c = bc.ceilings(pre_ms=10.0, engine_batch_ms=40.0, batch=8, cores=2, workers=1)
    assert c["per_slice_cpu_ms"] == 15.0
    assert c["cpu_ceiling_per_s"] == pytest.approx(2000 / 15.0, abs=0.01)
    assert c["pipelined_bound_per_s"] == pytest.approx(8000 / 80.0)  # preprocessing-bound: 8 x 10 ms on 1 core
    assert c["bound_per_s"] == min(c["cpu_ceiling_per_s"], c["pipelined_bound_per_s"])


def test_model_flops_counts_conv_and_matmul(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros((4, 2, 3, 3), dtype=np.float32), "w")
    m = numpy_helper.from_array(np.zeros((4 * 6 * 6, 5), dtype=np.float32), "m")
    shape = numpy_helper.from_array(np.asarray([1, -1], dtype=np.int64), "s")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "s"], ["r"]),
         helper.make_node("MatMul", ["r", "m"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], initializer=[w, m, shape])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    conv = 2 * (4 * 6 * 6) * (2 * 3 * 3)
    matmul = 2 * 5 * (4 * 6 * 6)
    assert bc.model_flops(path) == conv + matmul


def test_workload_mix_is_exact() -> None:
    import pydicom

    files = synthetic.workload("quarters", 8, seed=1)
    syntaxes = [pydicom.dcmread(__import__("io").BytesIO(f)).file_meta.TransferSyntaxUID for f in files]
    assert sorted({syntaxes.count(s) for s in set(syntaxes)}) == [2] and len(set(syntaxes)) == 4


def test_extended_report_against_a_running_daemon(app: RunningApp, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc = bench_main(["--target", app.target, "--target-pid", str(os.getpid()), "--workload", "native",
                     "--files", "4", "--warmup", "4", "--concurrency", "2", "--sweep", "1,2", "--duration", "0.4",
                     "--poisson", "0.5", "--bursts", "3x0.2x2", "--plot", str(tmp_path / "b"), "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, report
    assert set(report["latency_ms"]) == {"p50", "p90", "p99", "max"}  # the stable fields stay as they were
    assert report["throughput_per_s"] == report["sweep"]["appliance"]["2"]["throughput_per_s"]
    assert set(report["sweep"]["appliance"]) == {"1", "2"}
    point = report["sweep"]["appliance"]["2"]
    assert point["cpu_ms_per_request"] > 0 and point["wakeups_per_request"] >= 0
    assert point["page_faults_per_request"] >= 0
    assert 1 <= point["mean_batch"] <= 4  # the fake model's B is 4
    assert report["poisson"]["rate_per_s"] == pytest.approx(0.5 * report["capacity_per_s"]["appliance"], rel=0.01)
    assert len(report["bursts"]["appliance"]["burst_drain_ms"]) == 2
    assert report["targets"]["poisson_jitter_p99_p50"]["met"] in (True, False)
    assert "peer" not in report and "sequential_throughput_per_s" not in report
    if "error" not in report["plots"]:
        assert Path(report["plots"]["latency"]).stat().st_size > 0


def test_synth_writes_the_bench_workload(tmp_path: Path) -> None:
    from appliance.cli import main as cli_main

    assert cli_main(["synth", "--workload", "native", "--count", "3", "--seed", "5", "--out", str(tmp_path)]) == 0
    written = [p.read_bytes() for p in sorted(tmp_path.glob("native-*.dcm"))]
    assert written == synthetic.workload("native", 3, seed=5)


def test_triton_batch_stats_from_counter_deltas() -> None:
    from appliance.tools.benchpeer import batch_stats

    before = {"nv_inference_count": 10.0, "nv_inference_exec_count": 5.0, "nv_inference_queue_duration_us": 1000.0,
              "nv_inference_compute_infer_duration_us": 0.0}
    after = {"nv_inference_count": 42.0, "nv_inference_exec_count": 9.0, "nv_inference_queue_duration_us": 33000.0,
             "nv_inference_compute_infer_duration_us": 64000.0}
    stats = batch_stats(before, after, batch=8)
    assert stats == {"mean_batch": 8.0, "batch_fill": 1.0, "queue_ms": 1.0, "compute_ms_per_request": 2.0}
    assert batch_stats(after, after, batch=8)["mean_batch"] is None


def test_simulated_ideal_queue_waits_only_while_the_engine_idles() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "simulate.py"
    spec = importlib.util.spec_from_file_location("simulate", path)
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    # one request at a time, far apart: latency = its preprocessing + the wait + one batch
    lat = sim.simulate([2.0], engine_ms=10.0, batch=4, workers=1, max_wait_ms=5.0, rate_per_ms=1e-6, n=50)
    assert np.allclose(lat, 17.0)
    lat0 = sim.simulate([2.0], engine_ms=10.0, batch=4, workers=1, max_wait_ms=0.0, rate_per_ms=1e-6, n=50)
    assert np.allclose(lat0, 12.0)


def test_minor_faults_count_fresh_pages() -> None:
    import mmap

    from appliance.tools import benchcost

    before = benchcost.proc_tree_minor_faults(os.getpid())
    with mmap.mmap(-1, 8 << 20) as m:  # 2048 pages, each touched once
        for off in range(0, 8 << 20, mmap.PAGESIZE):
            m[off] = 1
    assert benchcost.proc_tree_minor_faults(os.getpid()) - before >= 2000


def test_ceilings_use_the_mean_of_the_cost_phases_before_and_after_the_load(monkeypatch) -> None:
    from appliance.tools import benchrun

    def costs(pre_ms: float, engine_ms: float) -> dict:
        return {"costs": {"preprocess": {"mean_ms": pre_ms}, "engine_batch_ms": engine_ms, "batch_size": 8,
                          "cpu": 1}}

    report = {**costs(10.0, 40.0), "ceiling": {"cores": 2, "workers": 1, **bc.ceilings(10.0, 40.0, 8, 2, 1)}}
    monkeypatch.setattr(benchrun, "_costs", lambda *a: costs(12.0, 44.0))  # the box slowed down meanwhile
    benchrun._costs_again(None, [], None, None, report)
    assert report["cost_drift"] == {"preprocess": 1.2, "engine": 1.1}
    assert report["costs_after"]["preprocess_mean_ms"] == 12.0
    assert report["ceiling"]["per_slice_cpu_ms"] == pytest.approx(11.0 + 42.0 / 8)
    assert report["ceiling"]["cpu_ceiling_per_s"] == pytest.approx(2000 / (11.0 + 42.0 / 8), abs=0.01)
    assert report["costs"]["preprocess"]["mean_ms"] == 10.0  # the first phase is kept as measured


def test_thread_cpu_keeps_the_cpu_of_threads_that_have_ended() -> None:
    """A JPEG 2000 decoder's threads live for one frame: their CPU must not vanish from the per-thread figures."""

    def spin() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.2:
            pass

    before = bc.thread_cpu_s(os.getpid())
    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()
    after = bc.thread_cpu_s(os.getpid())
    exited = next(k for k in after if k.endswith("/(exited threads)"))
    assert after[exited] - before.get(exited, 0.0) >= 0.15  # the kernel counts in ticks of 10 ms
