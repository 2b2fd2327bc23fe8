"""`appliance serve` refuses nonsense at start: exit 78 (EX_CONFIG), one line naming the key or path, and
never READY=1 first. Each case runs the real command as a subprocess with a fake NOTIFY_SOCKET.

The table is the contract of issue 12 ("Configuration refuses nonsense at start"); add rows, not tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.serving.notify import FakeNotifySocket
from tests.support import REPO, fake_daemon_toml, free_port

EX_CONFIG = 78


def _base(tmp_path: Path, listen: list[str] | None = None) -> str:
    listen = listen or [f"127.0.0.1:{free_port()}", f"unix:{tmp_path / 'run'}/grpc.sock"]
    return fake_daemon_toml(tmp_path, listen)


def _empty_pipelines_dir(tmp_path: Path) -> str:
    (tmp_path / "empty").mkdir()
    return _with("model", f'pipelines_dir = "{tmp_path / "empty"}"')(tmp_path)


def _corrupt_artifact(tmp_path: Path) -> str:
    """The model's artifact changed after its manifest was written: its sha256 no longer matches."""
    text = _base(tmp_path)
    for f in (tmp_path / "models" / "ct-nodule").iterdir():
        if f.name != "model.toml":
            f.write_bytes(f.read_bytes() + b"changed")
    return text


def _with(section: str, line: str) -> Callable[[Path], str]:
    """A config whose [section] gets ``line``, merged (no second table); a key already there is replaced."""

    def make(tmp_path: Path) -> str:
        text = _base(tmp_path)
        header = f"[{section}]\n"
        if header not in text:
            return text + f"\n{header}{line}\n"
        head, body = text.split(header, 1)
        section_end = body.find("\n[")
        own, rest = (body, "") if section_end < 0 else (body[:section_end], body[section_end:])
        key = line.split("=", 1)[0].strip()
        kept = [x for x in own.split("\n") if x.split("=", 1)[0].strip() != key]
        return head + header + line + "\n" + "\n".join(kept) + rest

    return make


def _listen(address: str) -> Callable[[Path], str]:
    return lambda tmp_path: _base(tmp_path, [f"{address}"])


def _socket_dir_world_writable(tmp_path: Path) -> str:
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    return _base(tmp_path, [f"unix:{d}/grpc.sock"])


def _socket_dir_not_ours(tmp_path: Path) -> str:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o750)
    os.chown(d, 65534, 65534)
    return _base(tmp_path, [f"unix:{d}/grpc.sock"])


def _port_in_use(key: str) -> Callable[[Path], str]:
    def make(tmp_path: Path) -> str:
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        _HELD.append(holder)
        port = holder.getsockname()[1]
        if key == "metrics.listen":
            return _with("metrics", f'listen = "127.0.0.1:{port}"')(tmp_path)
        return _base(tmp_path, [f"127.0.0.1:{port}"])

    return make


def _cache_under_a_file(tmp_path: Path) -> str:
    (tmp_path / "afile").write_text("x")
    return _with("engine", f'cache_dir = "{tmp_path}/afile/cache"')(tmp_path)


def _full_disk(tmp_path: Path) -> str:
    need = shutil.disk_usage(tmp_path).free + (1 << 30)
    return _with("engine", f'cache_dir = "{tmp_path}/cache"\nmin_free_bytes = {need}')(tmp_path)


_HELD: list[socket.socket] = []

CASES: list[tuple[str, Callable[[Path], str], str]] = [
    ("max_decoded_bytes=-1", _with("dicom", "max_decoded_bytes = -1"), "dicom.max_decoded_bytes"),
    ("max_pixels_per_frame=0", _with("dicom", "max_pixels_per_frame = 0"), "dicom.max_pixels_per_frame"),
    ("max_message_bytes=5e9", _with("server", "max_message_bytes = 5e9"), "server.max_message_bytes"),
    ("max_message_bytes=int64", _with("server", "max_message_bytes = 5000000000"), "server.max_message_bytes"),
    ("port 99999", _listen("127.0.0.1:99999"), "server.listen"),
    ("LAN without TLS", _listen("0.0.0.0:50051"), "server.listen"),
    ("socket dir uncreatable", _listen("unix:/nonexistent-appliance-parent/run/grpc.sock"), "/nonexistent-appliance"),
    ("socket dir world-writable", _socket_dir_world_writable, "shared"),
    ("server port in use", _port_in_use("server.listen"), "server.listen"),
    ("metrics.listen bad port", _with("metrics", 'listen = "127.0.0.1:99999"'), "metrics.listen"),
    ("metrics.listen not loopback", _with("metrics", 'listen = "0.0.0.0:9108"'), "metrics.listen"),
    ("metrics port in use", _port_in_use("metrics.listen"), "metrics.listen"),
    ("preprocess_workers=100000", _with("batcher", "preprocess_workers = 100000"), "batcher.preprocess_workers"),
    ("max_wait_s=1e9", _with("batcher", "max_wait_s = 1e9"), "batcher.max_wait_s"),
    ("grace_s over the stop timeout", _with("server", "grace_s = 60.0"), "server.grace_s"),
    ("unknown engine option", _with("engine", "options = { latency = 0.1 }"), "engine.options.latency"),
    ("cache dir unwritable", _cache_under_a_file, "engine.cache_dir"),
    ("disk full", _full_disk, "engine.cache_dir"),
    # ops review, session 14: both resolved against the working directory (/ under systemd) and were created there
    ("cache dir relative", _with("engine", 'cache_dir = "cache"'), "engine.cache_dir: must be an absolute path"),
    ("UID key file relative", _with("logging", 'uid_key_file = "keys/uid.key"'),
     "logging.uid_key_file: must be an absolute path"),
    ("TLS without a key", _with("tls", 'listen = ["0.0.0.0:50052"]\ncert_file = "/nonexistent.pem"'), "tls.key_file"),
    ("not TOML", lambda tmp_path: "[server\n", "appliance.toml"),
    ("model missing", _with("model", "name = \"no-such-model\""), "no-such-model/model.toml"),
    # ops review, session 14: both exited 1 (a restart loop under Restart=on-failure), the second naming the wrong key
    ("default pipeline unknown", _with("model", 'default_pipeline = "no-such-pipeline"'), "model.default_pipeline"),
    ("pipelines dir empty", _empty_pipelines_dir, "model.pipelines_dir"),
    # ops review, session 18: a gRPC traceback ("Event loop is closed") followed the one line; an unknown precision
    # did not name its key; a triton backend without url exited 1
    ("artifact changed", _corrupt_artifact, "sha256"),
    ("precision unknown", _with("model", 'precision = "int8"'), "config key model.precision = 'int8'"),
    ("triton without url", _with("engine", 'backend = "triton"'), "config key engine.options.url is empty"),
]
if os.geteuid() == 0:
    CASES.append(("socket dir not ours", _socket_dir_not_ours, "owned by uid 65534"))


def _run(cfg: Path, notify: FakeNotifySocket, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "NOTIFY_SOCKET": notify.address, "PYTHONPATH": str(REPO)}
    for key in ("JOURNAL_STREAM", "RUNTIME_DIRECTORY", "CACHE_DIRECTORY", "WATCHDOG_PID"):
        env.pop(key, None)
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _assert_refused(result: subprocess.CompletedProcess, notify: FakeNotifySocket, needle: str,
                    code: int = EX_CONFIG) -> None:
    """Exit 78; the only line above INFO is the refusal, and it is the last; no traceback; no READY=1."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr
    assert lines, result.stderr
    assert all(" INFO " in line for line in lines[:-1]), result.stderr
    assert "CRITICAL appliance: cannot start" in lines[-1] and needle in lines[-1], lines[-1]
    assert result.stdout == ""
    assert "READY=1" not in notify.messages()


@pytest.mark.parametrize(("make", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_exit_78_and_one_line(tmp_path: Path, make: Callable[[Path], str], needle: str) -> None:
    cfg = tmp_path / "appliance.toml"
    cfg.write_text(make(tmp_path))
    try:
        with FakeNotifySocket() as notify:
            result = _run(cfg, notify)
    finally:
        while _HELD:
            _HELD.pop().close()
    _assert_refused(result, notify, needle)


def test_unreadable_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "appliance.toml"
    cfg.write_text(_base(tmp_path))
    cfg.chmod(0o000)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root reads anything: run the child without the capabilities that allow it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv(1) is not installed")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--"]
    with FakeNotifySocket() as notify:
        result = _run(cfg, notify, prefix)
    _assert_refused(result, notify, str(cfg))
    assert "not readable" in result.stderr


def test_nvml_by_name_without_a_reading_exits_1_with_one_line(tmp_path: Path) -> None:
    """Held-out review, session 18: ``thermal.sensor = "nvml"`` on a box without NVML logged a WARNING and served
    with no temperature watched. Exit 1, not 78: a GPU driver that is not loaded yet may be there at the restart."""
    from appliance.thermal.nvml import NvmlThermometer

    probe = NvmlThermometer()
    try:
        if probe.available:
            pytest.skip("NVML answers on this machine")
    finally:
        probe.close()
    cfg = tmp_path / "appliance.toml"
    cfg.write_text(_with("thermal", 'sensor = "nvml"')(tmp_path))
    with FakeNotifySocket() as notify:
        result = _run(cfg, notify)
    _assert_refused(result, notify, 'config key thermal.sensor = "nvml" but NVML has no reading', code=1)
