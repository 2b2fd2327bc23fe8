"""No patient data leaves the daemon: known PatientName, PatientID, PatientBirthDate, AccessionNumber and
InstitutionName values are planted in DICOM inputs (valid, truncated, bit-flipped, not an image, not DICOM,
malformed values), sent to a real ``appliance -v serve`` (DEBUG logs) over unary and streaming RPCs, and then
searched for in everything the daemon wrote: stderr, replies (messages and error details), GetStatus, the
health CLI and the Prometheus text.

INPUTS is a table: add a row for each new kind of input (e.g. one that crashes a decoder worker).
"""

from __future__ import annotations

import io
import os
import random
import re
import signal
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path

import grpc
import pydicom
import pytest
from google.protobuf.json_format import MessageToJson
from pydicom.dataset import Dataset

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving.notify import FakeNotifySocket
from appliance.tools import synthetic
from appliance.workers.arena import _shm_dir
from tests.support import REPO, fake_daemon_config, free_port

PHI = {
    "PatientName": "QQPHIDOE^ALICIA^MARIE",
    "PatientID": "QQMRN-90210-77",
    "PatientBirthDate": "19470321",
    "AccessionNumber": "QQACC778899",
    "InstitutionName": "QQPHI Saint Example Hospital",
}
#: Fragments that must not appear either (a name split at ^, the date reformatted).
FRAGMENTS = ["QQPHIDOE", "ALICIA", "QQMRN", "90210-77", "19470321", "1947-03-21", "QQACC", "778899", "Saint Example"]


def _dataset(seed: int = 3, syntax: str = pydicom.uid.ExplicitVRLittleEndian) -> Dataset:
    data = synthetic.to_dicom(synthetic.generate_slice(seed, nodule=True, size=256), transfer_syntax=syntax)
    ds = pydicom.dcmread(io.BytesIO(data))
    for key, value in PHI.items():
        setattr(ds, key, value)
    ds.StudyID = "QQACC778899"
    ds.OtherPatientIDs = "QQMRN-90210-77"
    return ds


def _bytes(ds: Dataset) -> bytes:
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def _valid() -> bytes:
    return _bytes(_dataset())


def _valid_rle() -> bytes:
    return _bytes(_dataset(4, pydicom.uid.RLELossless))


def _truncated() -> bytes:
    data = _valid()
    return data[: len(data) // 2]


def _truncated_in_header() -> bytes:
    data = _valid()
    return data[: data.index(b"QQPHI Saint") + 20]


def _bit_flipped(seed: int) -> Callable[[], bytes]:
    def make() -> bytes:
        data = bytearray(_valid())
        rng = random.Random(seed)
        for _ in range(40):
            i = rng.randrange(132, len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)

    return make


def _not_an_image() -> bytes:
    ds = _dataset()
    del ds.PixelData
    ds.SOPClassUID = pydicom.uid.BasicTextSRStorage
    ds.file_meta.MediaStorageSOPClassUID = pydicom.uid.BasicTextSRStorage
    ds.Modality = "SR"
    return _bytes(ds)


def _malformed_values() -> bytes:
    ds = _dataset(5)
    with warnings.catch_warnings():  # pydicom warns here too, quoting the value: that is what we test
        warnings.simplefilter("ignore")
        ds.PatientBirthDate = "19470321QQ"  # not a DA
        ds.InstitutionName = PHI["InstitutionName"] + "\x01"  # a control character in an LO
        return _bytes(ds)


def _length_lies() -> bytes:
    """A group-0028 US element whose odd length runs over a private copy of the patient's name after it.

    pydicom's BytesLengthException quotes the raw bytes it read, and the daemon used to pass that text on.
    """
    ds = _dataset(6)
    for tag in [t for t in ds.keys() if t.group == 0x0028 and t.element > 0x0106]:
        del ds[tag]  # nothing between it and the name: the quoted bytes reach the name within the message's cut
    ds.add_new(0x00280106, "US", 0)  # Smallest Image Pixel Value
    ds.add_new(0x00290010, "LO", "VENDOR")
    ds.add_new(0x00291010, "LO", PHI["PatientName"] + "Z")  # even length: no padding byte after it
    data = bytearray(_bytes(ds))
    at = data.index(b"\x28\x00\x06\x01US")
    end = data.index(PHI["PatientName"].encode(), at) + len(PHI["PatientName"]) + 2
    data[at + 10:at + 10] = b"\x00"
    data[at + 6:at + 8] = (end - (at + 8)).to_bytes(2, "little")
    return bytes(data)


def _not_dicom() -> bytes:
    return b"\0" * 128 + b"XXXX" + ("|".join(PHI.values()) * 20).encode()


INPUTS: list[tuple[str, Callable[[], bytes]]] = [
    ("valid", _valid),
    ("valid-rle", _valid_rle),
    ("truncated", _truncated),
    ("truncated-in-header", _truncated_in_header),
    ("bit-flipped-1", _bit_flipped(1)),
    ("bit-flipped-2", _bit_flipped(2)),
    ("bit-flipped-3", _bit_flipped(3)),
    ("not-an-image", _not_an_image),
    ("malformed-values", _malformed_values),
    ("length-lies", _length_lies),
    ("not-dicom", _not_dicom),
]


def _leaks(text: str) -> list[str]:
    """The planted values and fragments found in ``text``.

    A fragment of digits only counts where it is not part of a longer number: replies and metrics carry timings
    printed to 16 digits, and "778899" turned up inside one of them by chance (about one run in a hundred).
    """
    return [s for s in [*PHI.values(), *FRAGMENTS]
            if (re.search(rf"(?<![\d.]){re.escape(s)}(?!\d)", text) if s.isdigit() else s in text)]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("phi")
    port, metrics = free_port(), free_port()
    cfg = fake_daemon_config(tmp, [f"127.0.0.1:{port}", f"unix:{tmp}/run/grpc.sock"], server="grace_s = 2.0",
                             metrics=f"127.0.0.1:{metrics}")
    stderr = open(tmp / "stderr.log", "wb")  # noqa: SIM115 - closed below
    with FakeNotifySocket() as notify:
        env = {**os.environ, "NOTIFY_SOCKET": notify.address, "PYTHONPATH": str(REPO)}
        env.pop("JOURNAL_STREAM", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "-v", "serve", "--config", str(cfg)],
            env=env, stdout=subprocess.PIPE, stderr=stderr,
        )
        try:
            assert notify.wait_for("READY=1", timeout=60), (tmp / "stderr.log").read_text()
            yield {"target": f"127.0.0.1:{port}", "metrics": metrics, "proc": proc, "stderr": tmp / "stderr.log"}
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
            stderr.close()
            assert out == b""


def test_nothing_the_daemon_writes_carries_patient_data(daemon) -> None:
    written: list[str] = []
    codes: dict[str, str] = {}
    with grpc.insecure_channel(daemon["target"]) as ch:
        stub = pb_grpc.InferenceStub(ch)
        for name, make in INPUTS:
            data = make()
            assert _leaks(data.decode("latin-1")), f"{name}: the input does not carry the planted values"
            try:
                reply = stub.Analyze(pb.AnalyzeRequest(dicom=data, request_id=f"phi-{name}"), timeout=20)
                codes[name] = "OK"
                written.append(MessageToJson(reply))
            except grpc.RpcError as e:
                codes[name] = e.code().name
                written.append(f"{e.code().name} {e.details()} {e.trailing_metadata()}")
        requests = [pb.AnalyzeRequest(dicom=make(), request_id=f"s-{name}") for name, make in INPUTS]
        for reply in stub.AnalyzeStream(iter(requests), timeout=60):
            written.append(MessageToJson(reply))
        written.append(MessageToJson(stub.GetStatus(pb.GetStatusRequest(), timeout=5)))
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon['metrics']}/metrics", timeout=5) as r:  # noqa: S310
        written.append(r.read().decode())
    health = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "health", "--target", daemon["target"], "--json"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    written.append(health.stdout + health.stderr)
    # shared memory: the slot arena, and each worker's input buffer (a memfd), which held a file until it was copied
    pid = daemon["proc"].pid
    arena = list(_shm_dir().glob(f"edge-appliance-{pid}-*.slots"))
    buffers = [fd for fd in Path(f"/proc/{pid}/fd").iterdir() if "memfd:edge-appliance-input" in os.readlink(fd)]
    assert len(arena) == 1 and len(buffers) >= 2, (arena, buffers)  # (each buffer's mapping keeps a second fd)
    shared = [*arena, *buffers]
    written.extend(path.read_bytes().decode("latin-1") for path in shared)
    daemon["proc"].send_signal(signal.SIGTERM)
    daemon["proc"].wait(timeout=30)
    log_text = daemon["stderr"].read_text(errors="replace")
    assert codes["valid"] == "OK" and codes["valid-rle"] == "OK"
    assert codes["not-dicom"] == "INVALID_ARGUMENT" and codes["truncated"] == "INVALID_ARGUMENT"
    assert "INTERNAL" not in codes.values(), codes
    assert " DEBUG " in log_text and "phi-valid" in log_text  # the daemon logged at DEBUG, about these requests
    daemon["log_text"] = log_text
    for i, text in enumerate(written):
        assert not _leaks(text), f"reply/status/metrics #{i} carries {_leaks(text)}: {text[:500]}"
    assert not _leaks(log_text), f"the daemon's log carries {_leaks(log_text)}"
    assert "Traceback" not in log_text


def test_uids_are_logged_hashed(daemon) -> None:
    log_text = daemon.get("log_text") or daemon["stderr"].read_text(errors="replace")
    uids = {str(_dataset().SOPInstanceUID), str(_dataset().StudyInstanceUID)}
    assert "sop=" in log_text or "uid:" in log_text
    assert not [u for u in uids if u in log_text]
