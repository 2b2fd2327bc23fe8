"""TLS and mTLS certificates on disk, re-read when they change (docs/security.md).

The files are read through grpc's dynamic server credentials: each new connection checks their inode, size and
mtime and picks up renewed certificates without a restart. A renewal that does not load (a half-written file, a
key that does not match) is logged and the previous certificates stay in use. A failure at start is a
:class:`~appliance.errors.ConfigError` naming the key and the path.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.errors import ConfigError

if TYPE_CHECKING:
    import grpc

    from appliance.config import TlsConfig

__all__ = ["CertificateFiles"]

log = logging.getLogger(__name__)


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path} (config key {key}): {e.strerror}") from None


class CertificateFiles:
    """The server certificate, key and client CA on disk, re-read when they change (grpc's fetcher hook)."""

    def __init__(self, tls: TlsConfig) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._signature = self._stat()
        self.reloads = 0  # how many times renewed files were picked up

    def _paths(self) -> list[str]:
        return [p for p in (self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file) if p]

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for p in self._paths():
            try:
                st = os.stat(p)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)

    def load(self) -> grpc.ServerCertificateConfiguration:
        """Read and check the files (the key matches the certificate; the CA bundle parses)."""
        import grpc

        tls = self.tls
        cert, key = _read(tls.cert_file, "tls.cert_file"), _read(tls.key_file, "tls.key_file")
        ca = _read(tls.client_ca_file, "tls.client_ca_file") if tls.client_ca_file else None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (ssl.SSLError, ValueError) as e:
            raise ConfigError(
                f"config keys tls.cert_file/tls.key_file: {tls.cert_file} and {tls.key_file} are not a PEM "
                f"certificate chain and its matching key ({e})"
            ) from None
        if ca is not None:
            try:
                context.load_verify_locations(cafile=tls.client_ca_file)
            except (ssl.SSLError, ValueError) as e:
                raise ConfigError(
                    f"config key tls.client_ca_file: {tls.client_ca_file} is not a PEM CA bundle ({e})"
                ) from None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Grpc calls this for each new connection: None = keep the current certificates."""
        try:
            with self._lock:
                signature = self._stat()
                if signature == self._signature:
                    return None
                self._signature = signature
                config = self.load()
                self.reloads += 1
            log.info("TLS certificates reloaded from %s", ", ".join(self._paths()))
            return config
        except ConfigError as e:
            log.warning("TLS certificate renewal not applied, keeping the previous certificates: %s", e)
        except Exception:  # noqa: BLE001 - never raise into grpc's handshake thread
            log.exception("TLS certificate reload failed; keeping the previous certificates")
        return None

    def credentials(self) -> grpc.ServerCredentials:
        """Dynamic server credentials: TLS, mTLS when a client CA is set (required unless configured off)."""
        import grpc

        initial = self.load()
        require = bool(self.tls.client_ca_file) and self.tls.require_client_cert
        # grpc takes None from the fetcher as "keep the current certificates"; types-grpcio's Callable omits None.
        return grpc.dynamic_ssl_server_credentials(
            initial, self.fetch, require_client_authentication=require  # type: ignore[arg-type]
        )
