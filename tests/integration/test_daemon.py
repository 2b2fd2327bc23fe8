"""`appliance serve` as a real process: sd_notify protocol through a fake NOTIFY_SOCKET, watchdog tied to
engine progress, SIGTERM drain and exit 0."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import FakeNotifySocket
from appliance.tools import synthetic
from tests.support import fake_daemon_config, free_port


def _config(tmp_path: Path, port: int, engine_options: str = "") -> Path:
    return fake_daemon_config(tmp_path, [f"127.0.0.1:{port}", f"unix:{tmp_path}/grpc.sock"], server="grace_s = 5.0",
                              engine=f"options = {{ {engine_options} }}")


def _start(cfg: Path, notify: FakeNotifySocket, watchdog_usec: int = 400_000,
           env_extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": str(watchdog_usec), **(env_extra or {})}
    env.pop("WATCHDOG_PID", None)
    return subprocess.Popen(
        [sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def _ready(cfg: Path, env_extra: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes],
                                                                                FakeNotifySocket]]:
    """A daemon on ``cfg`` that has sent READY=1; killed on the way out if it is still running."""
    with FakeNotifySocket() as notify:
        proc = _start(cfg, notify, env_extra=env_extra)
        try:
            assert notify.wait_for("READY=1", timeout=60), notify.messages()
            yield proc, notify
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)


def test_notify_ready_watchdog_stopping_exit0(tmp_path: Path) -> None:
    port = free_port()
    with _ready(_config(tmp_path, port)) as (proc, notify):
        assert notify.wait_for(lambda m: m.count("WATCHDOG=1") >= 2, timeout=10)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            data = synthetic.to_dicom(synthetic.generate_slice(3, size=512))
            reply = pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=data), timeout=10)
            assert len(reply.frames) == 1
        proc.send_signal(signal.SIGHUP)  # no live reload: logged and ignored, never fatal
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        messages = notify.messages()
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    assert "STOPPING=1" in messages
    assert messages.index("READY=1") < messages.index("STOPPING=1")
    assert not any("WATCHDOG=1" == m for m in messages[: messages.index("READY=1")])  # armed after READY
    pids = {n.pid for n in notify.notifications()}
    assert pids == {proc.pid}  # NotifyAccess=main


def test_sigint_drains_like_sigterm_and_says_which_it_was(tmp_path: Path) -> None:
    """Ops review, session 14: a SIGINT (Ctrl-C under `make run`) was logged as "SIGTERM: draining"."""
    with _ready(_config(tmp_path, free_port())) as (proc, _):
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-2000:]
    assert "SIGINT: draining" in text and "SIGTERM: draining" not in text, text[-2000:]


def test_an_engine_death_ends_the_process_so_it_is_restarted(tmp_path: Path) -> None:
    """Ops review, session 14: after an engine death the daemon sat NOT_SERVING until the watchdog (WatchdogSec,
    30 s in the unit) ran out. It now drains and exits 70 (EX_SOFTWARE): Restart=on-failure restarts it after
    RestartSec (5 s)."""
    port = free_port()
    with _ready(_config(tmp_path, port, engine_options="dead_after = 0")) as (proc, _):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            data = synthetic.to_dicom(synthetic.generate_slice(5, size=512))
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=data), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        out, _ = proc.communicate(timeout=30)
    text = out.decode(errors="replace")
    assert proc.returncode == 70, text[-2000:]
    assert "engine dead" in text and "restarts the process (exit 70)" in text, text[-2000:]


def test_hung_engine_stops_the_watchdog(tmp_path: Path) -> None:
    port = free_port()
    with _ready(_config(tmp_path, port, engine_options="hang_after = 0")) as (_, notify):
        assert notify.wait_for(lambda m: m.count("WATCHDOG=1") >= 2, timeout=10)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            data = synthetic.to_dicom(synthetic.generate_slice(4, size=512))
            future = pb_grpc.InferenceStub(ch).Analyze.future(pb.AnalyzeRequest(dicom=data), timeout=20)
            time.sleep(1.5)  # the engine hangs on this batch; pings must stop
            before = notify.messages().count("WATCHDOG=1")
            time.sleep(1.5)
            after = notify.messages().count("WATCHDOG=1")
            future.cancel()
        assert after == before, "watchdog kept pinging while the engine was hung"


@pytest.mark.parametrize("bad", ["[batcher]\nmax_wiat_s = 1\n"])
def test_bad_config_fails_fast_naming_the_key(tmp_path: Path, bad: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(bad)
    proc = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78  # EX_CONFIG (tests/integration/test_startup_refusals.py has the full table)
    assert "batcher.max_wiat_s" in proc.stderr


def test_sigterm_under_load_answers_every_request_and_exits_0(tmp_path: Path) -> None:
    """16 clients in flight (queued, parsing, preprocessing, one worker stuck in a spinning decoder): SIGTERM.
    Every call ends with its result or UNAVAILABLE, never CANCELLED, and the daemon exits 0 within grace."""
    import concurrent.futures
    import threading

    from appliance.tools.chaos import fault_case

    port = free_port()
    cfg = _config(tmp_path, port, engine_options="latency_s = 0.05")
    text = cfg.read_text().replace("grace_s = 5.0", "grace_s = 3.0")
    cfg.write_text(text + "[workers]\nstep_timeout_s = 30.0\n")
    notify = FakeNotifySocket()
    env = {**os.environ, "NOTIFY_SOCKET": notify.address, "APPLIANCE_TEST_DECODER_FAULTS": "1"}
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)], env=env,
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:
        assert notify.wait_for("READY=1", timeout=60), log_path.read_text()[-2000:]
        valid = synthetic.to_dicom(synthetic.generate_slice(5, size=512), transfer_syntax="1.2.840.10008.1.2.4.90")
        spin = fault_case("spin").data
        codes: list[str] = []
        stuck: list[str] = []  # the request whose worker spins: still unanswered at the end of grace
        lock = threading.Lock()
        stop = threading.Event()

        def client(i: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pb_grpc.InferenceStub(ch)
                while not stop.is_set():
                    data = spin if i == 0 else valid
                    try:
                        stub.Analyze(pb.AnalyzeRequest(dicom=data), timeout=30)
                        code = "OK"
                    except grpc.RpcError as e:
                        code = e.code().name
                    with lock:
                        codes.append(code)
                        if i == 0:
                            stuck.append(code)
                    if i == 0 or code != "OK":
                        return

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(client, i) for i in range(16)]
            wait_until = time.monotonic() + 30
            while time.monotonic() < wait_until and codes.count("OK") < 16:
                time.sleep(0.05)  # the load is flowing: requests are queued, parsing and preprocessing
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(20)
            elapsed = time.monotonic() - t0
            stop.set()
            for f in futures:
                f.result(30)
        assert rc == 0, log_path.read_text()[-3000:]
        assert elapsed < 3.0 + 5.0, elapsed
        assert "CANCELLED" not in codes, codes
        assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
        assert codes.count("OK") >= 16
        assert stuck == ["UNAVAILABLE"]
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()


def test_the_thermal_memory_outlives_the_process(tmp_path: Path) -> None:
    """docs/thermal.md, "Restarts": under systemd (``$STATE_DIRECTORY``) the daemon keeps what its governor learned
    and the next daemon starts from it."""
    cfg = _config(tmp_path, free_port())
    cfg.write_text(cfg.read_text().replace('[thermal]\nsensor = "none"', '[thermal]\nsensor = "sim"\nperiod_s = 0.2'))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    memory = state / "thermal-memory-gpu0.json"
    outputs, kept_at = [], []
    for _ in range(2):
        with _ready(cfg, {"STATE_DIRECTORY": str(state)}) as (proc, _notify):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # the first sample writes it (anew, in the second daemon)
                with contextlib.suppress(OSError, ValueError):
                    if json.loads(memory.read_text())["monotonic_s"] not in kept_at:
                        break
                time.sleep(0.05)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
        outputs.append(out.decode(errors="replace"))
        kept = json.loads(memory.read_text())
        assert kept["version"] == 1 and set(kept["learned"]) == {"integral_w", "w_per_duty", "die_w", "sink_w"}
        assert kept["monotonic_s"] not in kept_at  # written by this daemon, at its stop
        kept_at.append(kept["monotonic_s"])
        assert stat.S_IMODE(memory.stat().st_mode) == 0o600
    assert "resumed what it learned" not in outputs[0]
    assert "thermal governor resumed what it learned" in outputs[1], outputs[1][-2000:]
