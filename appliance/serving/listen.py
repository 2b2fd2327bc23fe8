"""Where the daemon listens: addresses parsed at load, socket directories checked, TLS/mTLS with reload.

Rules (docs/security.md):

- ``server.listen`` is plaintext and takes only loopback TCP (``127.0.0.1:P``, ``[::1]:P``, ``localhost:P``)
  and ``unix:PATH``. Any other host must go in ``[tls] listen``, which needs a certificate and key.
- A relative ``unix:NAME`` lives in :func:`runtime_dir` (``$RUNTIME_DIRECTORY`` under systemd).
- A socket directory must be a real directory owned by us and not writable by group or others; a missing
  one is created 0750. The socket itself is made 0660 (group ``server.socket_group``) before the server
  starts, so only the owner and the group can ``connect()``.
- TLS certificates are read through grpc's dynamic server credentials and reloaded when they change
  (:mod:`appliance.serving.tls`).

Every failure is a :class:`~appliance.errors.ConfigError` naming the key and the path, raised before READY=1.
"""

from __future__ import annotations

import grp
import ipaddress
import logging
import os
import re
import socket
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.errors import ConfigError
from appliance.serving.tls import CertificateFiles

if TYPE_CHECKING:
    import grpc

    from appliance.config import Config

__all__ = [
    "Address",
    "bind_listeners",
    "parse_address",
    "prepare_socket_dir",
    "runtime_dir",
    "socket_gid",
    "socket_path",
    "validate_listeners",
]

log = logging.getLogger(__name__)

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


@dataclass(frozen=True)
class Address:
    """One parsed listen address: ``kind`` is "tcp" (host, port) or "unix" (path)."""

    text: str
    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def loopback(self) -> bool:
        """True for a loopback TCP address (unix sockets are local, but not "loopback")."""
        if self.kind != "tcp":
            return False
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def target(self, port: int | None = None) -> str:
        """The address as grpc wants it (with ``port`` substituted, e.g. the one an ephemeral bind got)."""
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port if port is None else port}"


#: gRPC address schemes a listen key does not take, with why where it matters.
_OTHER_SCHEMES = {
    "unix-abstract": " (an abstract socket has no file mode, so any local user could connect)",
    "dns": "", "ipv4": "", "ipv6": "", "vsock": "",
}


def parse_address(text: str, key: str) -> Address:
    """Parse ``host:port`` (port 1..65535; 0 = any free port, for tests), ``[v6]:port`` or ``unix:PATH``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"config key {key}: empty address")
    if text.startswith("unix:"):
        path = text.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        if not path or "\0" in path or path.endswith("/"):
            raise ConfigError(f"config key {key}: {text!r} is not a usable unix socket path")
        return Address(text, "unix", path=path)
    scheme = text.partition(":")[0]
    if scheme in _OTHER_SCHEMES:
        raise ConfigError(f"config key {key}: {text!r}: gRPC's {scheme}: addresses are not served here; use host:port "
                          f"or unix:PATH{_OTHER_SCHEMES[scheme]}")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"config key {key}: {text!r} is not host:port or unix:PATH")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"config key {key}: port {port_text!r} in {text!r} is not in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"config key {key}: {text!r} has an invalid IPv6 address") from None
    else:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            if ":" in host or not _HOSTNAME.match(host):
                raise ConfigError(f"config key {key}: {text!r} has an invalid host (IPv6 needs [brackets])") from None
    return Address(text, "tcp", host=host, port=int(port_text))


def runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    """The directory for relative socket paths.

    ``$RUNTIME_DIRECTORY`` (systemd's ``RuntimeDirectory=``), else ``$XDG_RUNTIME_DIR/edge-appliance``, else
    ``<tmp>/edge-appliance-<uid>``.
    """
    env = os.environ if env is None else env
    if env.get("RUNTIME_DIRECTORY"):
        return Path(env["RUNTIME_DIRECTORY"].split(":")[0])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "edge-appliance"
    return Path(tempfile.gettempdir()) / f"edge-appliance-{os.geteuid()}"


def socket_path(address: Address, env: Mapping[str, str] | None = None) -> Path:
    """The absolute path of a unix address (relative paths are resolved in :func:`runtime_dir`)."""
    path = Path(address.path)
    return path if path.is_absolute() else runtime_dir(env) / path


def validate_listeners(cfg: Config) -> None:
    """Parse every address and check the TLS/access keys that go with them (called by load_config)."""
    plain = [parse_address(a, "server.listen") for a in cfg.server.listen]
    secure = [parse_address(a, "tls.listen") for a in cfg.tls.listen]
    if not plain and not secure:
        raise ConfigError("config key server.listen must name at least one address (or set tls.listen)")
    for a in plain:
        if a.kind == "tcp" and not a.loopback:
            raise ConfigError(
                f"config key server.listen: {a.text} is not a loopback address; plaintext gRPC is served only on "
                "loopback and unix sockets. Put it in [tls] listen with tls.cert_file and tls.key_file"
            )
    for a in secure:
        if a.kind != "tcp":
            raise ConfigError(f"config key tls.listen: {a.text}: TLS is for TCP; unix sockets are protected by mode")
    seen: set[str] = set()
    for a in (*plain, *secure):
        if a.text in seen and not (a.kind == "tcp" and a.port == 0):  # port 0: each bind gets its own port
            raise ConfigError(f"config key server.listen/tls.listen: {a.text} is listed twice")
        seen.add(a.text)
    _validate_tls(cfg, bool(secure))
    if cfg.metrics.listen:
        m = parse_address(cfg.metrics.listen, "metrics.listen")
        if m.kind != "tcp" or not (m.loopback or cfg.metrics.allow_non_loopback):
            raise ConfigError(
                f"config key metrics.listen: {m.text} must be a loopback host:port (metrics are plain HTTP; "
                "set metrics.allow_non_loopback = true to expose them, e.g. to a cluster's Prometheus)"
            )


def _validate_tls(cfg: Config, has_tls_listeners: bool) -> None:
    tls = cfg.tls
    given = [f"tls.{key}" for key in ("cert_file", "key_file", "client_ca_file") if getattr(tls, key)]
    if not has_tls_listeners and given:
        verb = "is" if len(given) == 1 else "are"
        raise ConfigError(f"config key tls.listen is empty but {' and '.join(given)} {verb} set: name the TLS "
                          "addresses in tls.listen, or remove the TLS files")
    if has_tls_listeners:
        for key in ("cert_file", "key_file"):
            if not getattr(tls, key):
                raise ConfigError(f"config key tls.{key} is required when tls.listen is set")
        CertificateFiles(tls).load()  # readable, PEM, key matches certificate, CA loads
    if cfg.access.analyze_subjects or cfg.access.status_subjects:
        if not tls.client_ca_file:
            raise ConfigError("config keys access.analyze_subjects/status_subjects need tls.client_ca_file (mTLS)")
        if not tls.require_client_cert:  # grpc then asks for no client certificate: no subject is verified
            raise ConfigError("config keys access.analyze_subjects/status_subjects need tls.require_client_cert = true")


# ---- unix sockets -----------------------------------------------------------------------------------------


def prepare_socket_dir(directory: Path, key: str = "server.listen") -> Path:
    """Create ``directory`` 0750 if missing; refuse one that is not ours or that others can write."""
    try:
        directory.mkdir(mode=0o750)
        os.chmod(directory, 0o750)  # mkdir's mode is reduced by the umask; state it exactly
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise ConfigError(
            f"cannot create socket directory {directory} (config key {key}): its parent is missing"
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot create socket directory {directory} (config key {key}): {e.strerror}") from None
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"socket directory {directory} (config key {key}) is not a directory (or is a symlink)")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"socket directory {directory} (config key {key}) is owned by uid {st.st_uid}, not by us "
            f"(uid {os.geteuid()}): another user could replace the socket"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"socket directory {directory} (config key {key}) is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}): another user could replace the socket"
        )
    return directory


def socket_gid(group: str) -> int:
    """The gid of ``server.socket_group`` (-1: none configured); ConfigError naming the key if no such group."""
    if not group:
        return -1
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"config key server.socket_group: no group named {group!r}") from None


def _bind_unix(server: grpc.aio.Server, address: Address, group: str) -> str:
    path = socket_path(address)
    prepare_socket_dir(path.parent)
    if path.exists() and not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise ConfigError(f"config key server.listen: {path} exists and is not a socket")
    if path.exists():
        _refuse_live_socket(path)
    gid = socket_gid(group)
    old = os.umask(0o117)  # the socket is born 0660: no window in which others may connect
    try:
        port = server.add_insecure_port(f"unix:{path}")
    except RuntimeError as e:
        raise ConfigError(f"cannot bind {path} (config key server.listen): {e}") from None
    finally:
        os.umask(old)
    if port == 0 or not path.exists():
        raise ConfigError(f"cannot bind {path} (config key server.listen)")
    try:
        os.chmod(path, 0o660)
        if gid != -1:
            os.chown(path, -1, gid)
    except OSError as e:
        raise ConfigError(f"cannot set mode/group of {path} (config key server.socket_group): {e.strerror}") from None
    return f"unix:{path}"


def _refuse_live_socket(path: Path) -> None:
    """Refuse a socket path another process still serves; a stale one (nobody accepts) is replaced.

    gRPC unlinks whatever socket is at the path and binds its own, so a second daemon given the same path (a manual
    or canary run) cut the running one off from its socket, and removed it on exit, even when that second daemon then
    failed to start for another reason (held-out review, session 18). TCP ports cannot be shared; now neither can this.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return  # left by a daemon that is gone
        except OSError as e:
            raise ConfigError(f"cannot bind {path} (config key server.listen): the socket there cannot be checked "
                              f"({e.strerror or e}); is another daemon using it?") from None
    raise ConfigError(f"cannot bind {path} (config key server.listen): another process is listening on it (a second "
                      "daemon? stop it, or give this one another path)")


def _probe_tcp(address: Address, key: str) -> None:
    """Bind the address with a plain socket first: a clean error (grpc's core would log its own lines)."""
    if address.port == 0:
        return
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"cannot resolve {address.text} (config key {key}): {e.strerror}") from None
    for family, kind, proto, _name, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc does: TIME_WAIT is no conflict
            try:
                probe.bind(sockaddr)
            except OSError as e:
                raise ConfigError(f"cannot bind {address.text} (config key {key}): {e.strerror}") from None


def _bind_tcp(server: grpc.aio.Server, address: Address, key: str, credentials: Any = None) -> str:
    _probe_tcp(address, key)
    try:
        if credentials is None:
            port = server.add_insecure_port(address.target())
        else:
            port = server.add_secure_port(address.target(), credentials)
    except RuntimeError as e:
        raise ConfigError(f"cannot bind {address.text} (config key {key}): {e}") from None
    if port == 0:
        raise ConfigError(f"cannot bind {address.text} (config key {key}): address in use or not on this host")
    return address.target(port)


def bind_listeners(server: grpc.aio.Server, cfg: Config) -> list[str]:
    """Bind every configured address on ``server`` (not yet started); return them as bound."""
    bound = []
    for text in cfg.server.listen:
        address = parse_address(text, "server.listen")
        if address.kind == "unix":
            bound.append(_bind_unix(server, address, cfg.server.socket_group))
        else:
            bound.append(_bind_tcp(server, address, "server.listen"))
    if cfg.tls.listen:
        credentials = CertificateFiles(cfg.tls).credentials()
        for text in cfg.tls.listen:
            bound.append(_bind_tcp(server, parse_address(text, "tls.listen"), "tls.listen", credentials))
    return bound
