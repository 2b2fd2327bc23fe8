"""What the daemon may write about a request: a validated request id and keyed hashes of UIDs.

- :func:`validate_request_id`: a client's ``request_id`` is echoed in replies and logs, so it must be short
  and printable (no newline can forge a log line, no 100 KB id fills the journal). Anything else is
  INVALID_ARGUMENT (field ``request_id``). Sites often use accession numbers as ids: docs/security.md asks
  integrators not to (hashed UIDs are enough to correlate a log line with a study).
- :func:`reply_uid`: a reply echoes the SOP Instance UID only when it has UID syntax; the element can hold any
  text (an ID, a name), and a reply is written to client logs and worklists as readily as ours.
- :func:`hash_uid`: a Study/Series/SOP Instance UID is not a name, but it identifies a patient's study in the
  PACS. Logs carry ``uid:<12 hex>``, HMAC-SHA256 under a secret key, so two log lines about the same instance
  correlate and the UID cannot be recovered by hashing candidate UIDs without the key. The key is random per
  daemon start unless ``logging.uid_key_file`` names a file (created 0600 with 32 random bytes if missing),
  which makes hashes stable across restarts for one install.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from pathlib import Path

from pydicom.uid import RE_VALID_UID

from appliance.errors import ConfigError, InputError

__all__ = ["MAX_REQUEST_ID", "clip", "hash_uid", "is_uid", "load_uid_key", "redact_foreign", "reply_uid", "set_uid_key",
           "uid_key", "validate_request_id"]

MAX_REQUEST_ID = 64
_MAX_UID = 64

_key_lock = threading.Lock()
_key = secrets.token_bytes(32)


def validate_request_id(rid: str) -> str:
    """Return ``rid`` if it is at most 64 printable ASCII characters (space allowed); else raise InputError."""
    if len(rid) > MAX_REQUEST_ID:
        raise InputError(f"request_id is {len(rid)} characters; at most {MAX_REQUEST_ID} allowed", field="request_id")
    for ch in rid:
        if not (" " <= ch <= "~"):
            raise InputError(
                f"request_id contains a non-printable or non-ASCII character (U+{ord(ch):04X})", field="request_id"
            )
    return rid


def set_uid_key(key: bytes) -> None:
    """Use ``key`` (>= 16 bytes) for :func:`hash_uid` from now on."""
    global _key
    if len(key) < 16:
        raise ValueError("the UID hash key must be at least 16 bytes")
    with _key_lock:
        _key = bytes(key)


def uid_key() -> bytes:
    """The current key: hand it to worker processes (``set_uid_key``) so their hashes match the daemon's."""
    with _key_lock:
        return _key


def load_uid_key(path: str) -> None:
    """Load the key from ``path`` (``logging.uid_key_file``), creating it 0600 if missing; "" = keep random."""
    if not path:
        return
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot create {p} (config key logging.uid_key_file): {e.strerror}") from None
    else:
        try:
            os.write(fd, secrets.token_bytes(32))
            os.fsync(fd)
        except OSError as e:
            raise ConfigError(f"cannot write {p} (config key logging.uid_key_file): {e.strerror}") from None
        finally:
            os.close(fd)
    try:
        st = p.stat()
        key = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {p} (config key logging.uid_key_file): {e.strerror}") from None
    if st.st_mode & 0o077:
        mode = st.st_mode & 0o777
        raise ConfigError(f"{p} (config key logging.uid_key_file) is readable by others (mode {mode:04o})")
    if len(key) < 16:
        raise ConfigError(f"{p} (config key logging.uid_key_file) holds {len(key)} bytes; at least 16 needed")
    set_uid_key(key)


# What a foreign library's message may quote from the file: a bytes or string literal (pydicom quotes the raw value
# of an element whose length lies, and a lying length in group 0028 swallows the elements after it), a DICOM person
# name (components joined by ^), or a long run of digits (an ID, a date).
_QUOTED = re.compile(r"""(?<!\w)b?'(?:[^'\\]|\\.)*'?|(?<!\w)b?"(?:[^"\\]|\\.)*"?""")
_NAME_OR_ID = re.compile(r"\S*\^\S*|\d{6,}")


def redact_foreign(text: str) -> str:
    """A foreign exception's message with every value it may quote from the input replaced by ``<value>``.

    For errors the appliance did not write itself (a decoder's or pydicom's), before they reach a client or a
    log: the appliance's own errors name the tag, never its value.
    """
    return _NAME_OR_ID.sub("<value>", _QUOTED.sub("<value>", text))


def clip(text: str, limit: int = 64) -> str:
    """A client-supplied name as an error message may echo it: at most ``limit`` characters, then its length.

    gRPC refuses trailing metadata over 16 KB, so a 20 KB model name echoed whole turned NOT_FOUND into a
    RESOURCE_EXHAUSTED "metadata size exceeds hard limit", which clients read as overload (session 18).
    """
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def is_uid(value: str) -> bool:
    """Whether ``value`` has UID syntax: digits and dots, no component with a leading zero, at most 64 characters.

    pydicom's own expression (PS3.5 9.1), matched over the whole value (so no trailing newline) and without building
    a pydicom ``UID``, whose constructor warns and logs an invalid value, quoting it.
    """
    return len(value) <= _MAX_UID and RE_VALID_UID.fullmatch(value) is not None


def reply_uid(uid: str) -> str:
    """``uid`` when it has UID syntax (:func:`is_uid`), else "" (a success reply's ``sop_instance_uid``)."""
    return uid if is_uid(uid) else ""


def hash_uid(uid: str) -> str:
    """``uid:`` + the first 12 hex digits of HMAC-SHA256(key, uid). Empty stays empty."""
    if not uid:
        return ""
    with _key_lock:
        key = _key
    return "uid:" + hmac.new(key, str(uid).encode("utf-8", "replace"), hashlib.sha256).hexdigest()[:12]
