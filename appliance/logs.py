r"""Logging for the daemon: one line per event, no patient data, journald fields under systemd.

:func:`configure_logging` sets up the root logger once (``appliance serve`` calls it first):

- **Destination.** Under systemd (``$JOURNAL_STREAM`` set) records go to journald through its native protocol:
  one datagram per record to ``/run/systemd/journal/socket`` holding ``KEY=value`` lines (a value with a
  newline is sent as ``KEY\\n<64-bit little-endian length><value>\\n``; systemd.journal-fields(7), "Native
  Journal Protocol"). Besides MESSAGE and PRIORITY each record carries LOGGER, CODE_FILE/LINE/FUNC and, when
  the call passes them as ``extra=``, REQUEST_ID, CODE and MS (``journalctl -u edge-appliance CODE=INTERNAL``).
  Elsewhere: one text line per record on stderr.
- **Third-party loggers** (pydicom, PIL, pylibjpeg, grpc, asyncio, ...) pass only at WARNING and above, and
  never with a traceback. Records from the decoding libraries (:data:`DATA_LOGGERS`) and Python warnings keep
  only the logger and level: their text can quote DICOM element values (a malformed PatientBirthDate, a name).
- grpc's C core logs on its own; ``GRPC_VERBOSITY=ERROR`` is set (if unset) before grpc is imported.

The journal socket path can be moved with ``$APPLIANCE_JOURNAL_SOCKET`` (tests point it at a
:class:`FakeJournal`, as they point ``$NOTIFY_SOCKET`` at a fake notify socket).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Mapping

__all__ = [
    "DATA_LOGGERS",
    "JOURNAL_SOCKET",
    "FakeJournal",
    "STRUCTURED_FIELDS",
    "JournalHandler",
    "ThirdPartyFilter",
    "configure_logging",
    "journal_fields",
    "parse_journal_datagram",
    "quiet_third_party",
]

JOURNAL_SOCKET = "/run/systemd/journal/socket"
#: Logger name prefixes whose messages may quote DICOM values: only "<logger> <LEVEL> (text withheld)" is kept.
DATA_LOGGERS = ("pydicom", "PIL", "pylibjpeg", "openjpeg", "libjpeg", "rle", "jpeg_ls", "py.warnings")
#: ``extra=`` attributes sent as journald fields.
STRUCTURED_FIELDS = {"request_id": "REQUEST_ID", "code": "CODE", "ms": "MS", "uid": "UID_HASH", "reason": "REASON"}
_QUIETED = (
    "pydicom", "PIL", "pylibjpeg", "openjpeg", "grpc", "asyncio", "urllib3", "matplotlib", "onnxruntime",
    "prometheus_client",
)
_CATEGORY = re.compile(r":\d+: (\w+(?:Warning|Error)):")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def quiet_third_party(level: int) -> None:
    """Let third-party loggers through only at WARNING and above (or ``level`` when higher).

    openjpeg's encoder, for one, logs every tile at INFO: a synthetic workload of a few hundred JPEG 2000 files
    would otherwise bury a command's own output.
    """
    for name in _QUIETED:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


class ThirdPartyFilter(logging.Filter):
    """Drop what third-party loggers must not put in the journal.

    Third-party records below WARNING, tracebacks of all third-party records, and the text of records from
    :data:`DATA_LOGGERS` go; records of ``appliance.*`` pass unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite or drop one record."""
        name = record.name
        if name == "appliance" or name.startswith("appliance."):
            return True
        if record.levelno < logging.WARNING:
            return False
        if record.exc_info:
            kind = record.exc_info[0].__name__ if record.exc_info[0] else "exception"
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            record.msg, record.args = f"{record.getMessage()} [{kind}; traceback withheld]", None
        if name.startswith(DATA_LOGGERS):
            category = ""
            if name == "py.warnings":
                found = _CATEGORY.search(record.getMessage())
                category = f" {found.group(1)}" if found else ""
            record.msg = f"{name} {record.levelname}{category} (text withheld: may quote DICOM values)"
            record.args = None
        return True


def journal_fields(record: logging.LogRecord, message: str, identifier: str) -> dict[str, str]:
    """The journald fields of one record (MESSAGE, PRIORITY, ..., REQUEST_ID/CODE/MS when given)."""
    priority = 7 if record.levelno < 20 else 6 if record.levelno < 30 else 4 if record.levelno < 40 else 3
    if record.levelno >= logging.CRITICAL:
        priority = 2
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(priority),
        "SYSLOG_IDENTIFIER": identifier,
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
        "THREAD_NAME": record.threadName or "",
    }
    for attr, key in STRUCTURED_FIELDS.items():
        value = getattr(record, attr, None)
        if value is not None:
            fields[key] = f"{value:.1f}" if isinstance(value, float) else str(value)
    return fields


def _encode(fields: Mapping[str, str]) -> bytes:
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalHandler(logging.Handler):
    """Sends each record to journald as one native-protocol datagram (see the module docstring)."""

    def __init__(self, socket_path: str = JOURNAL_SOCKET, identifier: str = "edge-appliance") -> None:
        super().__init__()
        self.socket_path = socket_path
        self.identifier = identifier
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record; on failure fall back to logging's handleError (stderr)."""
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + self.formatter.formatException(record.exc_info) if self.formatter else ""
            data = _encode(journal_fields(record, message, self.identifier))
            if len(data) > 200_000:  # beyond a datagram's size; journald would need a memfd
                data = _encode(journal_fields(record, message[:8192] + " [truncated]", self.identifier))
            self._sock.sendto(data, self.socket_path)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()
        super().close()


def parse_journal_datagram(data: bytes) -> dict[str, str]:
    """Decode one native-protocol datagram (both field encodings) into a dict."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode("utf-8", "replace")
            i = nl + 1
        else:
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            fields[line.decode()] = data[nl + 9 : nl + 9 + size].decode("utf-8", "replace")
            if data[nl + 9 + size : nl + 10 + size] != b"\n":
                raise ValueError("binary journal field not terminated by a newline")
            i = nl + 10 + size
    return fields


class FakeJournal:
    """Stands in for journald's socket: binds a datagram socket in a temp dir and collects parsed entries.

    ``with FakeJournal() as j:`` start the daemon with ``JOURNAL_STREAM=…`` and
    ``APPLIANCE_JOURNAL_SOCKET=j.address``; then read ``j.entries()``.
    """

    def __init__(self) -> None:
        self._tmpdir = tempfile.mkdtemp(prefix="appliance-journal-")
        self.address = os.path.join(self._tmpdir, "socket")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.bind(self.address)
        os.chmod(self.address, 0o666)
        self._sock.settimeout(0.05)
        self._entries: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, name="fake-journal", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._entries.append(parse_journal_datagram(data))

    def entries(self) -> list[dict[str, str]]:
        """Every entry received so far, in order."""
        with self._lock:
            return list(self._entries)

    def close(self) -> None:
        """Stop reading and remove the socket (idempotent)."""
        if not self._closing.is_set():
            self._closing.set()
            self._reader.join(2)
            self._sock.close()
            for path in (self.address, self._tmpdir):
                try:
                    os.rmdir(path) if path == self._tmpdir else os.unlink(path)
                except OSError:
                    pass

    def __enter__(self) -> FakeJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _use_journal(journald: bool | str, env: Mapping[str, str], journal_socket: str) -> bool:
    if journald in (True, "yes"):
        return True
    if journald in (False, "no"):
        return False
    return bool(env.get("JOURNAL_STREAM")) and os.path.exists(journal_socket)


def configure_logging(
    level: str | int = "info",
    journald: bool | str = "auto",
    *,
    journal_socket: str | None = None,
    env: Mapping[str, str] | None = None,
    stream: object = None,
) -> logging.Handler:
    """Set up the root logger for the daemon and return its handler (replacing any earlier one).

    ``level``: "debug", "info", "warning", "error" or a logging level. ``journald``: True/"yes", False/"no",
    or "auto" (when ``$JOURNAL_STREAM`` is set and the journal socket exists).
    """
    env = os.environ if env is None else env
    journal_socket = journal_socket or env.get("APPLIANCE_JOURNAL_SOCKET") or JOURNAL_SOCKET
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    numeric = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler: logging.Handler
    if _use_journal(journald, env, journal_socket):
        handler = JournalHandler(journal_socket)
        handler.setFormatter(logging.Formatter())
    else:
        handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    handler.addFilter(ThirdPartyFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    quiet_third_party(numeric)
    logging.captureWarnings(True)  # warnings.warn text goes through the filter above, not raw to stderr
    return handler
