"""`appliance serve` under "systemd": with $JOURNAL_STREAM set it logs to journald's socket (a FakeJournal
here) with structured fields, and nothing on stderr. Each request, failed ones included, is one entry
with REQUEST_ID, CODE and MS fields, and an invalid request_id is refused (docs/operations.md, "Logs")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest

from appliance.logs import FakeJournal
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import FakeNotifySocket
from appliance.tools import synthetic
from tests.support import REPO, fake_daemon_config, free_port


@pytest.fixture(scope="module")
def journaled(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("journal")
    port = free_port()
    cfg = fake_daemon_config(tmp, [f"127.0.0.1:{port}"], server="grace_s = 2.0")
    with FakeJournal() as journal, FakeNotifySocket() as notify:
        env = {
            **os.environ,
            "NOTIFY_SOCKET": notify.address,
            "JOURNAL_STREAM": "9:12345",
            "APPLIANCE_JOURNAL_SOCKET": journal.address,
            "PYTHONPATH": str(REPO),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            assert notify.wait_for("READY=1", timeout=60)
            target = f"127.0.0.1:{port}"
            good = synthetic.to_dicom(synthetic.generate_slice(2, size=256))
            codes = {}
            with grpc.insecure_channel(target) as ch:
                stub = pb_grpc.InferenceStub(ch)
                stub.Analyze(pb.AnalyzeRequest(dicom=good, request_id="jr-ok"), timeout=10)
                codes["jr-ok"] = "OK"
                for rid, data in (("jr-bad", good[: len(good) // 2]), ("jr\nCRITICAL forged", good)):
                    try:
                        stub.Analyze(pb.AnalyzeRequest(dicom=data, request_id=rid), timeout=10)
                        codes[rid] = "OK"
                    except grpc.RpcError as e:
                        codes[rid] = e.code().name
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            time.sleep(0.2)  # the reader thread drains the last datagrams
            yield {"entries": journal.entries(), "stdout": out, "stderr": err, "rc": proc.returncode, "codes": codes}
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)


def test_daemon_logs_to_journald_with_fields(journaled) -> None:
    entries = journaled["entries"]
    assert journaled["rc"] == 0
    assert journaled["stderr"] == b"" and journaled["stdout"] == b""
    listening = [e for e in entries if e["MESSAGE"].startswith("listening on")]
    assert len(listening) == 1
    e = listening[0]
    assert e["PRIORITY"] == "6" and e["SYSLOG_IDENTIFIER"] == "edge-appliance" \
        and e["LOGGER"] == "appliance.serving.app"
    assert e["CODE_FILE"].endswith("app.py") and int(e["CODE_LINE"]) > 0
    assert any(x["MESSAGE"] == "stopped" for x in entries)


def test_each_request_has_one_entry_with_request_id_code_and_ms(journaled) -> None:
    by_id = {}
    for e in journaled["entries"]:
        if "REQUEST_ID" in e:
            by_id.setdefault(e["REQUEST_ID"], []).append(e)
    assert [e["CODE"] for e in by_id["jr-ok"]] == ["OK"] and float(by_id["jr-ok"][0]["MS"]) > 0
    assert [e["CODE"] for e in by_id["jr-bad"]] == ["INVALID_ARGUMENT"]  # one entry per decode failure


def test_request_id_with_a_newline_is_invalid_argument(journaled) -> None:
    assert journaled["codes"]["jr\nCRITICAL forged"] == "INVALID_ARGUMENT"
    assert not any("forged" in e["MESSAGE"] for e in journaled["entries"])
