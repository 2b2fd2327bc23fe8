"""request_id validation, keyed UID hashes, third-party log quieting and the journald native protocol (a real
datagram socket standing in for /run/systemd/journal/socket)."""

from __future__ import annotations

import io
import logging
import os
import socket
import stat
import struct
from pathlib import Path

import pytest

from appliance import privacy
from appliance.errors import ConfigError, InputError
from appliance.logs import ThirdPartyFilter, configure_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("pydicom", "grpc", "asyncio", "PIL")}
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        if h not in handlers:
            h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)
    logging.captureWarnings(False)


@pytest.mark.parametrize("rid", ["", "r-1", "A" * 64, "study 12/series 3:slice#4", "~!@#$%^&*()"])
def test_request_id_accepted(rid: str) -> None:
    assert privacy.validate_request_id(rid) == rid


@pytest.mark.parametrize(
    ("rid", "why"),
    [
        ("x\nCRITICAL forged line", "U+000A"),
        ("tab\there", "U+0009"),
        ("A" * 65, "65 characters"),
        ("A" * 100_000, "100000 characters"),
        ("caf\u00e9", "U+00E9"),
        ("nul\0", "U+0000"),
        ("esc\x1b[31m", "U+001B"),
    ],
)
def test_request_id_refused_as_invalid_argument(rid: str, why: str) -> None:
    with pytest.raises(InputError) as e:
        privacy.validate_request_id(rid)
    assert e.value.field == "request_id"
    assert why in str(e.value)
    assert len(str(e.value)) < 120  # the id itself is never echoed back


def test_hash_uid_is_keyed_short_and_stable() -> None:
    uid = "1.2.826.0.1.3680043.8.498.12345678901234567890"
    privacy.set_uid_key(b"k" * 32)
    first = privacy.hash_uid(uid)
    assert first == privacy.hash_uid(uid) and first.startswith("uid:") and len(first) == 16
    assert uid not in first and privacy.hash_uid(uid + "1") != first
    privacy.set_uid_key(b"j" * 32)
    assert privacy.uid_key() == b"j" * 32
    assert privacy.hash_uid(uid) != first  # without the key, candidate UIDs cannot be hashed to match
    assert privacy.hash_uid("") == ""


def test_uid_key_file_is_created_0600_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "uid.key"
    privacy.load_uid_key(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    a = privacy.hash_uid("1.2.3")
    privacy.set_uid_key(b"x" * 32)
    privacy.load_uid_key(str(path))
    assert privacy.hash_uid("1.2.3") == a
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="logging.uid_key_file"):
        privacy.load_uid_key(str(path))


def _record(name: str, level: int, msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("PatientName=DOE^JANE")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord(name, level, __file__, 1, msg, args or None, exc_info)


def test_third_party_filter() -> None:
    f = ThirdPartyFilter()
    ours = _record("appliance.serving.server", logging.DEBUG, "kept %s", "as is")
    assert f.filter(ours) and ours.getMessage() == "kept as is"
    assert not f.filter(_record("grpc._cython", logging.INFO, "chatter"))
    pyd = _record("pydicom", logging.WARNING, "Invalid value for VR DA: '%s'", "19991399")
    assert f.filter(pyd) and "19991399" not in pyd.getMessage() and "withheld" in pyd.getMessage()
    warned = _record("py.warnings", logging.WARNING, "%s", "/x/values.py:12: UserWarning: bad 'DOE^JANE'\n  w()")
    assert f.filter(warned) and "DOE^JANE" not in warned.getMessage() and "UserWarning" in warned.getMessage()
    tb = _record("grpc.aio", logging.ERROR, "handler failed", exc=True)
    assert f.filter(tb) and tb.exc_info is None and "ValueError" in tb.getMessage()
    assert "DOE^JANE" not in tb.getMessage()


def test_stderr_lines_are_one_per_record(restore_logging) -> None:
    out = io.StringIO()
    configure_logging("info", journald=False, stream=out)
    logging.getLogger("pydicom").error("could not decode %s", "DOE^JANE", exc_info=ValueError("DOE^JANE"))
    logging.getLogger("pydicom").info("chatty %s", "DOE^JANE")
    logging.getLogger("appliance.x").info("decode failed: %s", "INVALID_DICOM")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "DOE^JANE" not in out.getvalue()


def _parse_journal(data: bytes) -> dict[str, str]:
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            i = nl + 1
        else:
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            fields[line.decode()] = data[nl + 9 : nl + 9 + size].decode()
            assert data[nl + 9 + size : nl + 10 + size] == b"\n"
            i = nl + 10 + size
    return fields


def test_journald_native_protocol_with_structured_fields(tmp_path: Path, restore_logging) -> None:
    path = str(tmp_path / "journal.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(path)
        journal.settimeout(5)
        configure_logging("debug", "auto", journal_socket=path, env={"JOURNAL_STREAM": "8:1234"})
        log = logging.getLogger("appliance.serving.analyze")
        log.info("Analyze done", extra={"request_id": "r-7", "code": "OK", "ms": 12.345})
        log.warning("two\nlines")
        first, second = _parse_journal(journal.recv(65536)), _parse_journal(journal.recv(65536))
    assert first["MESSAGE"] == "Analyze done" and first["PRIORITY"] == "6"
    assert (first["REQUEST_ID"], first["CODE"], first["MS"]) == ("r-7", "OK", "12.3")
    assert first["SYSLOG_IDENTIFIER"] == "edge-appliance" and first["LOGGER"] == "appliance.serving.analyze"
    assert first["CODE_FILE"].endswith("test_logs_privacy.py") and int(first["CODE_LINE"]) > 0
    assert second["MESSAGE"] == "two\nlines" and second["PRIORITY"] == "4"  # binary-safe field encoding
    assert "REQUEST_ID" not in second


def test_journald_auto_needs_journal_stream(tmp_path: Path, restore_logging) -> None:
    path = tmp_path / "journal.sock"
    path.touch()
    handler = configure_logging("info", "auto", journal_socket=str(path), env={}, stream=io.StringIO())
    assert type(handler).__name__ == "StreamHandler"
    assert os.environ.get("GRPC_VERBOSITY")


def test_foreign_messages_lose_every_value_they_quote() -> None:
    text = ("Instead received b'\\x00)\\x00LO\\x08\\x00ZZTEST^MARKER' with length 35 and struct format 'H'; "
            'value "ZZTEST^MARKER", date 19700101, id 4455667, name ZZTEST^MARKER')
    out = privacy.redact_foreign(text)
    assert "ZZTEST" not in out and "MARKER" not in out and "19700101" not in out and "4455667" not in out
    assert "length 35" in out and "struct format <value>" in out  # the rest of the message stays
    assert privacy.redact_foreign("can't decode tile 3: it's truncated") == "can't decode tile 3: it's truncated"


def test_an_element_whose_length_lies_does_not_leak_the_elements_it_swallows() -> None:
    """Held-out review: pydicom's BytesLengthException quoted the raw bytes of the private name after it."""
    import io

    import numpy as np
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    from appliance import dicom
    from appliance.workers.child import encode_error

    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = CTImageStorage, generate_uid(), "CT"
    ds.Rows = ds.Columns = 16
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.add_new(0x00280106, "US", 0)  # Smallest Image Pixel Value: its length will lie
    ds.add_new(0x00290010, "LO", "ACME 1.0")
    ds.add_new(0x00291010, "LO", "ZZTEST^MARKERS")  # a vendor's private copy of a name (even length: no padding)
    ds.PixelData = np.zeros((16, 16), np.uint16).tobytes()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    b = bytearray(buf.getvalue())
    at = b.find(b"\x28\x00\x06\x01US")
    end = b.find(b"ZZTEST^MARKERS", at) + len("ZZTEST^MARKERS") + 1
    b[at + 10:at + 10] = b"\x00"  # an odd length that runs over the private elements
    struct.pack_into("<H", b, at + 6, end - (at + 8))
    with pytest.raises(BaseException) as info:
        dicom.parse(bytes(b))
    raw = str(info.value)
    name, message, _, _ = encode_error(info.value)
    # pydicom's own text quotes the swallowed bytes; since session 20 the parse names the element in its own words
    # (it used to let pydicom's BytesLengthException out, and the worker's encode_error hid its text)
    for text in (raw, message):
        assert "MARKER" not in text and "ZZTEST" not in text and "ACME" not in text
    assert message == "(0028,0106) Smallest Image Pixel Value cannot be read as US: BytesLengthException"
    assert name == "DicomError"


def test_a_foreign_exception_from_a_worker_is_reported_without_the_bytes_it_quotes() -> None:
    """What the worker's encode_error does for an exception that is not ours (a decoder's, pydicom's): its text can
    quote the file's bytes, so values are redacted and the element it names comes first."""
    from pydicom.errors import BytesLengthException

    from appliance.workers.child import encode_error

    error = BytesLengthException("Expected total bytes to be an even multiple of bytes per value. Instead received "
                                 "b'\\x00ZZTEST^MARKERS' with length 15 reading (0028,0106)")
    name, message, field, _ = encode_error(error)
    assert name == "DicomError" and field == "dicom.PixelData"
    assert message.startswith("decoder failed on (0028,0106): BytesLengthException")
    assert "MARKER" not in message and "ZZTEST" not in message


@pytest.mark.parametrize("uid", ["1.2.840.10008.1.2", "0", "0.1.2", "1" * 64, "1" * 65, "PHIID778899", "1.02", "1..2",
                                 ".1", "1.2.", "1.2.3\n", " 1.2", "1.2 ", "", "1,2", "١.٢"])
def test_reply_uid_echoes_only_uid_syntax_as_pydicom_judges_it(uid: str) -> None:
    import warnings

    from pydicom.uid import UID

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        valid = UID(uid).is_valid and str(UID(uid)) == uid  # pydicom strips what it reads; a reply does not
    assert privacy.reply_uid(uid) == (uid if valid else "")
