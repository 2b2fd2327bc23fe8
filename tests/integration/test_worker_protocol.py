"""A real worker process over its pipe: the protocol of appliance.workers.child, message by message; and a
worker that dies while idle."""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from pathlib import Path

import grpc
import numpy as np
import pydicom
import pytest

from appliance import dicom
from appliance.config import WorkersConfig
from appliance.pipeline.loader import load_pipelines
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools import synthetic
from appliance.workers import child
from appliance.workers.arena import InputBuffer, SlotArena
from appliance.workers.child import WorkerSpec, worker_main
from tests.support import RunningApp, fake_config

REPO = Path(__file__).resolve().parents[2]
INBOX = 1 << 20  # each worker's input buffer in these tests


@pytest.fixture
def worker(models_dir: Path) -> Iterator[tuple[object, SlotArena]]:
    pipeline = load_pipelines(REPO / "pipelines", models_dir)["ct-nodule"]
    arena = SlotArena.create(2, tuple(pipeline.input_shape))
    inputs = InputBuffer(INBOX)
    spec = WorkerSpec(arena=arena.spec, pipelines_dir=str(REPO / "pipelines"), models_dir=str(models_dir),
                      model=pipeline.model, limits=dicom.DicomLimits(), memory_bytes=0, input_bytes=INBOX)
    arena.inbox = inputs.bytes  # type: ignore[attr-defined]  # the worker's input buffer, for the tests
    ctx = mp.get_context("forkserver")
    conn, end = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(end, spec), daemon=True)
    proc.start()
    end.close()
    send_handle(conn, inputs.fd, proc.pid or 0)  # as the pool does: the buffer's descriptor comes first
    assert conn.poll(60) and conn.recv()[0] == "ready"
    arena.pid = proc.pid  # type: ignore[attr-defined]  # the worker's, for the tests
    try:
        yield conn, arena
    finally:
        conn.send(("stop",))
        proc.join(5)
        if proc.is_alive():
            proc.kill()
        arena.close()
        inputs.close()


def _file(seed: int, frames: int) -> bytes:
    """A synthetic CT slice, repeated as ``frames`` frames of one instance."""
    ds = pydicom.dcmread(io.BytesIO(synthetic.to_dicom(synthetic.generate_slice(seed, size=256))))
    pixels = ds.pixel_array
    ds.NumberOfFrames = frames
    ds.PixelData = np.stack([pixels] * frames).tobytes()
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _parse(conn: object, job: int, frames: int, inbox: np.ndarray | None = None) -> None:
    """Send a file of ``frames`` frames through the worker's input buffer ``inbox``, or else the pipe."""
    data = _file(job, frames)
    if inbox is not None:
        inbox[: len(data)] = np.frombuffer(data, np.uint8)
        conn.send(("parse", job, "ct-nodule", len(data)))  # type: ignore[attr-defined]
    else:
        conn.send(("parse", job, "ct-nodule", -1))  # type: ignore[attr-defined]
        conn.send_bytes(data)  # type: ignore[attr-defined]
    reply = conn.recv()  # type: ignore[attr-defined]
    assert reply[:3] == ("parsed", job, frames), reply
    if inbox is not None:
        assert not inbox.any()  # the worker zeroed the file once it had copied it out


def test_the_last_frame_message_makes_the_worker_forget_the_instance(worker: tuple[object, SlotArena]) -> None:
    conn, arena = worker
    _parse(conn, 1, 2, arena.inbox)  # type: ignore[attr-defined]
    conn.send(("frame", 1, 0, 0, False, 1))  # type: ignore[attr-defined]
    assert conn.recv()[:2] == ("frame", 1)  # type: ignore[attr-defined]
    assert np.abs(arena.slots[0]).sum() > 0  # decoded straight into the slot
    conn.send(("frame", 1, 1, 1, True, 1))  # type: ignore[attr-defined]
    assert conn.recv()[:2] == ("frame", 1)  # type: ignore[attr-defined]
    conn.send(("frame", 1, 0, 0, False, 1))  # asked again after the last frame: the instance is gone
    reply = conn.recv()  # type: ignore[attr-defined]
    assert reply[0] == "error" and "lost the parsed instance" in reply[2][1], reply


def test_drop_forgets_an_instance_whose_last_frame_was_never_asked_for(worker: tuple[object, SlotArena]) -> None:
    conn, _ = worker
    _parse(conn, 2, 2)
    conn.send(("drop", 2))  # type: ignore[attr-defined]
    conn.send(("frame", 2, 0, 0, True, 1))  # type: ignore[attr-defined]
    reply = conn.recv()  # type: ignore[attr-defined]
    assert reply[0] == "error" and "lost the parsed instance" in reply[2][1], reply
    _parse(conn, 3, 1)  # the worker goes on with the next job (this file through the pipe)
    conn.send(("frame", 3, 0, 1, True, 1))  # type: ignore[attr-defined]
    assert conn.recv()[:2] == ("frame", 3)  # type: ignore[attr-defined]


def test_a_forked_child_reads_its_own_memory_figures_not_its_parents() -> None:
    assert child._rss_bytes() > 0  # opens /proc/self/statm in this process
    ctx = mp.get_context("fork")
    conn, end = ctx.Pipe(duplex=False)

    def report() -> None:
        child._rss_bytes()
        end.send(child._statm[0] == os.getpid() and child._rss_bytes() > 0)

    proc = ctx.Process(target=report)
    proc.start()
    assert conn.poll(30) and conn.recv() is True
    proc.join(5)


def test_a_worker_that_dies_while_idle_is_replaced_and_counted_before_the_next_file_reaches_it(
        models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="appliance.workers")
    app = RunningApp(fake_config(models_dir, batcher={"preprocess_workers": 2}))
    try:
        with grpc.insecure_channel(app.target) as ch:
            stub = pb_grpc.InferenceStub(ch)
            data = synthetic.to_dicom(synthetic.generate_slice(7, size=256))
            assert len(stub.Analyze(pb.AnalyzeRequest(dicom=data), timeout=30).frames) == 1
            pool = app.app.pool
            victims = list(pool._procs.values())
            for proc in victims:  # both idle: the OOM killer, or an operator's kill
                os.kill(proc.pid, signal.SIGKILL)
            for proc in victims:
                proc.join(10)
            for _ in range(4):  # every file is answered; none is sent to a dead worker
                assert len(stub.Analyze(pb.AnalyzeRequest(dicom=data), timeout=30).frames) == 1
            assert pool.restarts == 2
            assert all(p.is_alive() and p not in victims for p in pool._procs.values())
            assert caplog.text.count("exited while idle (killed by SIGKILL)") == 2, caplog.text
    finally:
        app.stop()


def test_a_worker_exit_is_described_for_what_it_was() -> None:
    from appliance.workers.processes import exit_text

    assert exit_text(-9) == "killed by SIGKILL" and exit_text(-11) == "killed by SIGSEGV"
    assert exit_text(3) == "exit code 3" and "forkserver could not report" in exit_text(255)
    assert exit_text(None) == "exit status not known yet"


def test_a_file_claimed_larger_than_the_input_buffer_is_an_error_and_the_worker_goes_on(
        worker: tuple[object, SlotArena]) -> None:
    conn, arena = worker
    conn.send(("parse", 4, "ct-nodule", INBOX + 1))  # type: ignore[attr-defined]
    reply = conn.recv()  # type: ignore[attr-defined]
    assert reply[0] == "error" and reply[2][0] == "ApplianceError" and "input buffer" in reply[2][1], reply
    _parse(conn, 5, 1, arena.inbox)  # type: ignore[attr-defined]


def test_files_larger_than_the_input_buffer_take_the_pipe(models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = synthetic.to_dicom(synthetic.generate_slice(3, size=256))
    large = synthetic.to_dicom(synthetic.generate_slice(3, size=512))
    piped: list[int] = []
    send_bytes = Connection.send_bytes

    def record(self: Connection, buf: bytes, *args: int) -> None:  # the daemon's side of every worker pipe
        piped.append(len(buf))
        send_bytes(self, buf, *args)

    monkeypatch.setattr(Connection, "send_bytes", record)
    app = RunningApp(fake_config(models_dir, workers={"input_buffer_bytes": (len(small) + len(large)) // 2}))
    try:
        with grpc.insecure_channel(app.target) as ch:
            stub = pb_grpc.InferenceStub(ch)
            for data in (small, large, small):
                reply = stub.Analyze(pb.AnalyzeRequest(dicom=data), timeout=30)
                assert len(reply.frames) == 1 and reply.status.code == 0
            assert app.app.pool.restarts == 0
    finally:
        app.stop()
    assert piped == [len(large)]  # the small file twice through the shared buffer, the large one by pipe


def test_a_file_left_in_the_buffer_by_a_worker_killed_before_it_copied_it_out_is_zeroed(models_dir: Path) -> None:
    app = RunningApp(fake_config(models_dir, batcher={"preprocess_workers": 2}, workers={"step_timeout_s": 0.5}))
    try:
        pool = app.app.pool
        assert pool.wait_started(30)
        stopped = [p.pid for p in pool._procs.values()]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)  # alive, but never reads the file: the step runs out its budget
        with grpc.insecure_channel(app.target) as ch, pytest.raises(grpc.RpcError) as failed:
            pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=_file(9, 1)), timeout=30)
        assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failed.value.details()
        assert pool.restarts >= 1
        assert all(not buffer.bytes.any() for buffer in pool._inputs)  # the file did not stay in shared memory
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        app.stop()


def test_a_jpeg2000_frame_on_two_threads_costs_the_worker_no_malloc_arena(worker: tuple[object, SlotArena]) -> None:
    """The decoder's threads share the worker's one malloc arena: glibc would give each its own 64 MiB of address
    space, which counts against workers.memory_bytes for the rest of the worker's life."""
    conn, arena = worker
    data = synthetic.workload("j2k", 1, 0)[0]
    inbox = arena.inbox  # type: ignore[attr-defined]
    pid = arena.pid  # type: ignore[attr-defined]
    vm_before = 0
    for job, threads in ((1, 1), (2, 2), (3, 2)):
        inbox[: len(data)] = np.frombuffer(data, np.uint8)
        conn.send(("parse", job, "ct-nodule", len(data)))  # type: ignore[attr-defined]
        assert conn.recv()[:3] == ("parsed", job, 1)  # type: ignore[attr-defined]
        if job == 2:
            vm_before = int(Path(f"/proc/{pid}/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        conn.send(("frame", job, 0, 0, True, threads))  # type: ignore[attr-defined]
        assert conn.recv()[:2] == ("frame", job)  # type: ignore[attr-defined]
    vm_after = int(Path(f"/proc/{pid}/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    assert vm_after - vm_before < 48 << 20


def test_workers_run_below_the_daemon_by_workers_nice(models_dir: Path) -> None:
    # The engine thread and the event loop wake and run at once; the workers take what is left (docs/performance.md,
    # "Where the idle core goes"). The default is 10.
    assert WorkersConfig().nice == 10
    for nice in (None, 3):
        app = RunningApp(fake_config(models_dir, **({} if nice is None else {"workers": {"nice": nice}})))
        try:
            assert app.app.pool.wait_started(60)
            daemon = os.getpriority(os.PRIO_PROCESS, 0)
            pids = [p.pid for p in app.app.pool._procs.values()]
            assert pids and all(os.getpriority(os.PRIO_PROCESS, pid) == min(19, daemon + (nice or 10)) for pid in pids)
        finally:
            app.stop()
