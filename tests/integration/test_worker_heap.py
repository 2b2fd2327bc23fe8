"""Workers reuse their heap: an uncompressed 512x512 slice costs no fresh pages once the worker is warm.

With glibc's default malloc thresholds every request's 0.5-2 MiB buffers come back as new pages (~600 minor
faults per slice, about 2.4 ms of CPU here); ``[workers] heap_keep_bytes`` keeps them (appliance.heap).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from appliance import heap
from appliance.heap import DAEMON_ARENAS, DAEMON_MAX_BLOCK, MMAP_THRESHOLD_MAX, keep_heap
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools import synthetic
from appliance.tools.benchcost import proc_tree_minor_faults
from tests.support import RunningApp, fake_config


def _faults_per_slice(models_dir: Path, keep: int) -> float:
    files = [synthetic.to_dicom(synthetic.generate_slice(s, size=512)) for s in range(6)]
    app = RunningApp(fake_config(models_dir, batcher={"preprocess_workers": 2}, workers={"heap_keep_bytes": keep}))
    try:
        with grpc.insecure_channel(app.target) as ch:
            stub = pb_grpc.InferenceStub(ch)

            def send_all() -> None:
                for data in files:
                    assert len(stub.Analyze(pb.AnalyzeRequest(dicom=data), timeout=30).frames) == 1

            send_all()  # warm: first use of each code path and buffer size
            pids = [p.pid for p in app.app.pool._procs.values()]
            before = sum(proc_tree_minor_faults(p) for p in pids)
            for _ in range(3):
                send_all()
            assert [p.pid for p in app.app.pool._procs.values()] == pids  # no worker was replaced meanwhile
            return (sum(proc_tree_minor_faults(p) for p in pids) - before) / (3 * len(files))
    finally:
        app.stop()


@pytest.mark.skipif(heap._glibc() is None, reason="malloc thresholds are a glibc setting")
def test_workers_reuse_their_heap(models_dir: Path) -> None:
    kept = _faults_per_slice(models_dir, 64 << 20)
    default = _faults_per_slice(models_dir, 0)
    assert default > 300, default  # glibc's defaults: the slice's buffers come back as fresh pages (~600 here)
    # What is left is first touches of shared batch slots not yet used by that worker (64 pages each).
    assert kept < default / 4, (kept, default)


class _FakeLibc:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_keep_heap_sets_both_thresholds() -> None:
    libc = _FakeLibc()
    assert keep_heap(64 << 20, libc=libc)  # type: ignore[arg-type]
    assert libc.calls == [(-3, MMAP_THRESHOLD_MAX), (-1, 64 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    libc = _FakeLibc()
    assert keep_heap(8 << 20, libc=libc)  # type: ignore[arg-type]
    assert libc.calls == [(-3, 8 << 20), (-1, 8 << 20)]


def test_keep_heap_for_the_daemon_maps_large_blocks_and_bounds_the_arenas() -> None:
    libc = _FakeLibc()
    assert keep_heap(64 << 20, max_block=DAEMON_MAX_BLOCK, arenas=DAEMON_ARENAS, libc=libc)  # type: ignore[arg-type]
    # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_ARENA_MAX
    assert libc.calls == [(-3, DAEMON_MAX_BLOCK), (-1, 64 << 20), (-8, DAEMON_ARENAS)]
    assert DAEMON_MAX_BLOCK < 8 << 20 and 1 <= DAEMON_ARENAS <= 4


def test_keep_heap_zero_leaves_malloc_alone_and_refusal_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    libc = _FakeLibc()
    assert not keep_heap(0, libc=libc)  # type: ignore[arg-type]
    assert libc.calls == []
    assert not keep_heap(1 << 20, libc=_FakeLibc(answer=0))  # type: ignore[arg-type]
    assert "mallopt refused" in caplog.text


def test_keep_heap_says_when_libc_is_not_glibc(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    with caplog.at_level("INFO", logger="appliance.heap"):
        assert not keep_heap(64 << 20)
    assert "workers.heap_keep_bytes has no effect here" in caplog.text


def test_workers_ask_the_oom_killer_to_take_them_before_the_daemon(models_dir: Path) -> None:
    """Ops review, session 14: the unit's OOMScoreAdjust=-500 was inherited by the workers, so a worker that
    hoarded memory was no likelier to be killed than the daemon; a worker is replaced, the daemon is not."""
    from appliance.workers.child import WORKER_OOM_SCORE_ADJ

    app = RunningApp(fake_config(models_dir))
    try:
        pids = [p.pid for p in app.app.pool._procs.values()]
        assert pids
        for pid in pids:
            assert int(Path(f"/proc/{pid}/oom_score_adj").read_text()) == WORKER_OOM_SCORE_ADJ
        assert int(Path("/proc/self/oom_score_adj").read_text()) < WORKER_OOM_SCORE_ADJ
    finally:
        app.stop()
