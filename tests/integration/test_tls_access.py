"""TLS, mutual TLS, certificate reload, the subject allow-list and the unix-socket rules, over real gRPC on
loopback with real certificates (tests/tls_testkit.py) and the fake engine."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from appliance.errors import ConfigError
from appliance.proto.inference import grpc_service_pb2 as oip
from appliance.proto.inference import grpc_service_pb2_grpc as oip_grpc
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.oip_wire import serialize_bytes
from appliance.tools import synthetic
from tests.support import RunningApp, fake_config
from tests.tls_testkit import Issued, issue, make_ca


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued]:
    ca = make_ca()
    return {
        "ca": ca,
        "server": issue(ca, "localhost", server=True),
        "pacs": issue(ca, "pacs-1"),
        "monitor": issue(ca, "monitor"),
        "stranger": issue(ca, "stranger"),
        "other_ca": make_ca("Other CA"),
    }


@pytest.fixture(scope="module")
def slice_bytes() -> bytes:
    return synthetic.to_dicom(synthetic.generate_slice(5, nodule=True, size=256))


def _write_server_files(d: Path, pki: dict[str, Issued]) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    cert, key = pki["server"].write(d, "server")
    ca = d / "clients-ca.crt"
    ca.write_bytes(pki["ca"].cert_pem)
    return {"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(ca)}


def _channel(target: str, ca: Issued, client: Issued | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        ca.cert_pem, client.key_pem if client else None, client.cert_pem if client else None
    )
    return grpc.secure_channel(target, creds)


def _status(channel: grpc.Channel) -> pb.Status:
    return pb_grpc.InferenceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)


@pytest.fixture(scope="module")
def mtls(models_dir: Path, pki: dict[str, Issued], tmp_path_factory: pytest.TempPathFactory):
    """A daemon with mTLS on loopback, an allow-list, a unix socket, and plaintext loopback limited to status."""
    d = tmp_path_factory.mktemp("mtls")
    files = _write_server_files(d / "tls", pki)
    sock = d / "run" / "grpc.sock"
    config = fake_config(
        models_dir,
        server={"listen": [f"unix:{sock}", "127.0.0.1:0"]},
        tls={"listen": ["127.0.0.1:0"], **files},
        access={
            "analyze_subjects": ["pacs-1"],
            "status_subjects": ["O=Test Hospital,CN=monitor"],
            "loopback": "status",
        },
    )
    app = RunningApp(config)
    app.tls_target = app.app.addresses[-1]
    app.plain_target = app.app.addresses[1]
    app.sock = sock
    app.files = files
    yield app
    app.stop()


def test_mtls_allow_list_separates_analyze_from_status(mtls, pki, slice_bytes) -> None:
    with _channel(mtls.tls_target, pki["ca"], pki["pacs"]) as ch:
        assert _status(ch).state == "SERVING"
        reply = pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=slice_bytes), timeout=10)
        assert len(reply.frames) == 1
    with _channel(mtls.tls_target, pki["ca"], pki["monitor"]) as ch:  # listed by full subject
        assert _status(ch).state == "SERVING"
        check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=slice_bytes), timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "CN=monitor" in e.value.details() and "Analyze" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # the streaming RPC is guarded too
            list(pb_grpc.InferenceStub(ch).AnalyzeStream(iter([pb.AnalyzeRequest(dicom=slice_bytes)]), timeout=10))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with _channel(mtls.tls_target, pki["ca"], pki["stranger"]) as ch:  # valid certificate, not on any list
        for call in (lambda: _status(ch),
                     lambda: health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_under_mtls_the_client_certificate_is_the_sender_on_every_inference_rpc(mtls, pki, slice_bytes,
                                                                              monkeypatch) -> None:
    senders = mtls.app.path._senders
    seen: list[str] = []
    count = senders.count

    def recording(source: str):
        seen.append(source)
        return count(source)

    monkeypatch.setattr(senders, "count", recording)
    for _ in range(2):  # two connections of one client: one sender
        with _channel(mtls.tls_target, pki["ca"], pki["pacs"]) as ch:
            pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=slice_bytes), timeout=10)
            list(pb_grpc.InferenceStub(ch).AnalyzeStream(iter([pb.AnalyzeRequest(dicom=slice_bytes)]), timeout=10))
            _oip_infer(ch, slice_bytes)
    assert len(seen) == 6 and len(set(seen)) == 1, seen
    assert seen[0].startswith("x509:") and "CN=pacs-1" in seen[0]


def _oip_infer(channel: grpc.Channel, dicom: bytes) -> oip.ModelInferResponse:
    request = oip.ModelInferRequest(model_name="ct-nodule-dicom", id="acl-1")
    request.inputs.add(name="dicom", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(serialize_bytes([dicom]))
    return oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)


def test_oip_inference_needs_the_analyze_role_and_its_metadata_calls_only_status(mtls, pki, slice_bytes) -> None:
    """Held-out review, session 14: a monitoring certificate and a status-only loopback got findings from
    ModelInfer; only appliance.v1's Analyze methods were guarded."""
    with _channel(mtls.tls_target, pki["ca"], pki["pacs"]) as ch:
        assert _oip_infer(ch, slice_bytes).outputs
    for channel in (lambda: _channel(mtls.tls_target, pki["ca"], pki["monitor"]),
                    lambda: grpc.insecure_channel(mtls.plain_target)):
        with channel() as ch:
            stub = oip_grpc.GRPCInferenceServiceStub(ch)
            assert stub.ServerLive(oip.ServerLiveRequest(), timeout=5).live
            assert stub.ModelMetadata(oip.ModelMetadataRequest(name="ct-nodule-dicom"), timeout=5).inputs
            with pytest.raises(grpc.RpcError) as e:
                _oip_infer(ch, slice_bytes)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "ModelInfer" in e.value.details()


def test_a_common_name_that_spells_a_listed_subject_is_not_that_subject(mtls, pki) -> None:
    """Held-out review, session 14: CN "O=Test Hospital,CN=monitor" in an O=Evil certificate got the status role."""
    forged = issue(pki["ca"], "O=Test Hospital,CN=monitor", organization="Evil")
    with _channel(mtls.tls_target, pki["ca"], forged) as ch, pytest.raises(grpc.RpcError) as e:
        _status(ch)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_mtls_refuses_clients_without_a_certificate_or_from_another_ca(mtls, pki) -> None:
    with _channel(mtls.tls_target, pki["ca"]) as ch, pytest.raises(grpc.RpcError) as e:
        _status(ch)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    rogue = issue(pki["other_ca"], "pacs-1")  # right name, wrong issuer
    with _channel(mtls.tls_target, pki["ca"], rogue) as ch, pytest.raises(grpc.RpcError) as e:
        _status(ch)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(mtls.tls_target) as ch, pytest.raises(grpc.RpcError) as e:  # plaintext to TLS
        _status(ch)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_loopback_is_status_only_and_the_socket_may_analyze(mtls, slice_bytes) -> None:
    with grpc.insecure_channel(mtls.plain_target) as ch:
        assert _status(ch).state == "SERVING"
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=slice_bytes), timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with grpc.insecure_channel(f"unix:{mtls.sock}") as ch:
        reply = pb_grpc.InferenceStub(ch).Analyze(pb.AnalyzeRequest(dicom=slice_bytes), timeout=10)
        assert len(reply.frames) == 1


def test_socket_is_0660_in_a_0750_directory_we_own(mtls) -> None:
    st = os.stat(mtls.sock)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    d = os.stat(mtls.sock.parent)
    assert stat.S_IMODE(d.st_mode) == 0o750 and d.st_uid == os.geteuid()


def test_reflection_is_off_with_tls_unless_asked(mtls) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f"unix:{mtls.sock}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_renewed_certificates_are_used_without_a_restart(models_dir, pki, tmp_path: Path) -> None:
    files = _write_server_files(tmp_path / "tls", pki)
    config = fake_config(
        models_dir, server={"listen": [], "reflection": True}, tls={"listen": ["127.0.0.1:0"], **files}
    )
    app = RunningApp(config)
    try:
        target = app.target
        with _channel(target, pki["ca"], pki["pacs"]) as ch:
            assert _status(ch).state == "SERVING"
        # A half-written renewal (garbage key) is refused with a warning; the old certificates stay in use.
        Path(files["key_file"]).write_bytes(b"-----BEGIN PRIVATE KEY-----\ngarbage\n")
        with _channel(target, pki["ca"], pki["pacs"]) as ch:
            assert _status(ch).state == "SERVING"
        # The real renewal: a server certificate from a new CA. New connections get it; no restart.
        new_ca = make_ca("Renewed CA")
        new_cert, new_key = issue(new_ca, "localhost", server=True).write(tmp_path / "tls", "server")
        os.utime(new_cert, ns=(time.time_ns() + 10**9,) * 2)
        assert new_cert == Path(files["cert_file"]) and new_key == Path(files["key_file"])
        with _channel(target, new_ca, pki["pacs"]) as ch:
            assert _status(ch).state == "SERVING"
        with _channel(target, pki["ca"], pki["pacs"]) as ch, pytest.raises(grpc.RpcError):
            _status(ch)  # the old server certificate is no longer presented
    finally:
        app.stop()


def test_tls_config_errors_name_the_key(models_dir, pki, tmp_path: Path) -> None:
    files = _write_server_files(tmp_path / "tls", pki)
    wrong_key = tmp_path / "other.key"
    wrong_key.write_bytes(pki["pacs"].key_pem)
    cases = [
        ({"listen": ["0.0.0.0:0"]}, {}, "tls.cert_file"),
        ({"listen": ["0.0.0.0:0"], **files, "key_file": str(wrong_key)}, {}, "tls.key_file"),
        ({"listen": ["unix:/tmp/x.sock"], **files}, {}, "tls.listen"),
        ({"listen": ["127.0.0.1:0"], "cert_file": files["cert_file"], "key_file": files["key_file"]},
         {"analyze_subjects": ["pacs-1"]}, "tls.client_ca_file"),
    ]
    for tls, access, key in cases:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            fake_config(models_dir, tls=tls, access=access)


def test_relative_socket_lives_in_the_runtime_directory(models_dir, tmp_path: Path, monkeypatch) -> None:
    runtime = tmp_path / "runtime"
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(runtime))
    app = RunningApp(fake_config(models_dir, server={"listen": ["unix:grpc.sock", "127.0.0.1:0"]}))
    try:
        assert app.app.addresses[0] == f"unix:{runtime}/grpc.sock"
        assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o750
        with grpc.insecure_channel(f"unix:{runtime}/grpc.sock") as ch:
            assert _status(ch).state == "SERVING"
    finally:
        app.stop()


def test_health_cli_over_mtls(mtls, pki, tmp_path: Path, capsys) -> None:
    from appliance.cli import main as cli_main

    def health(who: str) -> int:
        cert, key = pki[who].write(tmp_path, who)
        ca = tmp_path / "ca.crt"
        ca.write_bytes(pki["ca"].cert_pem)
        return cli_main(["health", "--target", mtls.tls_target, "--tls-ca", str(ca),
                         "--tls-cert", str(cert), "--tls-key", str(key)])

    assert health("monitor") == 0
    assert "EDGE-APPLIANCE OK" in capsys.readouterr().out
    assert health("stranger") == 3  # PERMISSION_DENIED is an unexpected answer: UNKNOWN
    out = capsys.readouterr().out
    assert "refused this client: PERMISSION_DENIED" in out and "_InactiveRpcError" not in out  # session 14
    rogue = issue(pki["other_ca"], "monitor")  # a certificate the daemon's CA did not sign: no handshake
    cert, key = rogue.write(tmp_path, "rogue")
    assert cli_main(["health", "--target", mtls.tls_target, "--tls-ca", str(tmp_path / "ca.crt"),
                     "--tls-cert", str(cert), "--tls-key", str(key), "--timeout", "1"]) == 2
    out = capsys.readouterr().out
    assert "unreachable within 1 s: " in out and "check --tls-ca, --tls-cert, --tls-key" in out, out


def test_client_certificate_not_required_means_plain_tls(models_dir, pki, tmp_path: Path) -> None:
    """grpc's require_client_authentication=False does not even ask for a client certificate, so nothing a
    client presents is verified: the allow-list cannot be combined with it (a config error)."""
    files = _write_server_files(tmp_path / "tls", pki)
    tls = {"listen": ["127.0.0.1:0"], **files, "require_client_cert": False}
    with pytest.raises(ConfigError, match="tls.require_client_cert"):
        fake_config(models_dir, server={"listen": []}, tls=tls, access={"analyze_subjects": ["pacs-1"]})
    app = RunningApp(fake_config(models_dir, server={"listen": []}, tls=tls))
    try:
        for client in (None, pki["pacs"], issue(pki["other_ca"], "pacs-1")):
            with _channel(app.target, pki["ca"], client) as ch:
                assert _status(ch).state == "SERVING"
    finally:
        app.stop()


def test_socket_directory_rules(tmp_path: Path) -> None:
    from appliance.serving.listen import Address, prepare_socket_dir, runtime_dir, socket_path

    real = tmp_path / "real"
    real.mkdir(mode=0o750)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symlink"):
        prepare_socket_dir(link)
    group_writable = tmp_path / "gw"
    group_writable.mkdir()
    group_writable.chmod(0o770)
    with pytest.raises(ConfigError, match="0770"):
        prepare_socket_dir(group_writable)
    created = prepare_socket_dir(tmp_path / "new")
    assert stat.S_IMODE(created.stat().st_mode) == 0o750
    assert runtime_dir({"RUNTIME_DIRECTORY": "/run/appliance:/run/other"}) == Path("/run/appliance")
    assert runtime_dir({"XDG_RUNTIME_DIR": "/run/user/1000"}) == Path("/run/user/1000/edge-appliance")
    assert runtime_dir({}).name == f"edge-appliance-{os.geteuid()}"
    assert socket_path(Address("unix:/x/y.sock", "unix", path="/x/y.sock"), {}) == Path("/x/y.sock")


def _start_and_stop(models_dir: Path, socket: Path) -> None:
    """Start an App listening on ``socket`` only, then stop it (a failed start raises its error)."""
    import asyncio

    from appliance.serving.app import App

    app = App(fake_config(models_dir, server={"listen": [f"unix:{socket}"]}))

    async def run() -> None:
        try:
            await app.start()
        finally:
            await app.stop(0)

    asyncio.run(run())


def test_a_regular_file_where_the_socket_goes_is_refused(models_dir, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    (run / "grpc.sock").write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        _start_and_stop(models_dir, run / "grpc.sock")



def test_a_socket_another_process_serves_is_refused_and_left_alone(models_dir, tmp_path: Path) -> None:
    """Held-out review, session 18: a second daemon given the running one's socket path unlinked that socket and
    bound its own (gRPC does), even when it then failed to start: the first daemon lost its DICOM router's path."""
    import socket as _socket

    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    path = run / "grpc.sock"
    live = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen(1)
    try:
        with pytest.raises(ConfigError, match="another process is listening on it"):
            _start_and_stop(models_dir, path)
        probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        probe.connect(str(path))  # the first server's socket is still there and still answers
        probe.close()
    finally:
        live.close()
    _start_and_stop(models_dir, path)  # nobody accepts on it now: a stale socket is replaced
