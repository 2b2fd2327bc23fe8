"""The systemd notify boundary: ``sd_notify``, the ``Notifier`` seam, the watchdog policy, and fakes.

The unit (``systemd/edge-appliance.service``) is ``Type=notify`` with ``NotifyAccess=main`` and
``WatchdogSec=30s``. The daemon talks to systemd only through a :class:`Notifier`:

* ``READY=1`` once the engine is warm, ``STATUS=...`` for humans (``systemctl status``),
  ``EXTEND_TIMEOUT_USEC=...`` re-sent while a slow engine build runs, ``STOPPING=1`` on SIGTERM.
* ``WATCHDOG=1`` every ``watchdog_interval_s`` from the event loop, but only through a :class:`Watchdog`,
  which stays silent while the engine thread's heartbeat is stale, so systemd restarts a hung engine.

Protocol facts (sd_notify(3), sd_watchdog_enabled(3)): one ``AF_UNIX``/``SOCK_DGRAM`` datagram of
newline-separated ``KEY=value`` assignments to ``$NOTIFY_SOCKET``; a leading ``@`` names an abstract socket.
``WATCHDOG_USEC`` is honoured only if ``WATCHDOG_PID`` is unset or equals our pid; ping every half of it.

Fakes shipped for tests and ``appliance doctor``: :class:`RecordingNotifier` (records the messages) and
:class:`FakeNotifySocket` (a real socket that stands in for systemd's end).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "FakeNotifySocket",
    "Notification",
    "Notifier",
    "NullNotifier",
    "RecordingNotifier",
    "SystemdNotifier",
    "Watchdog",
    "sd_notify",
    "watchdog_interval_from_env",
]

_log = logging.getLogger(__name__)

# NOTIFY_SOCKET values that already produced a send warning: warn once per address, not per ping.
_warned_addresses: set[str] = set()


def sd_notify(message: str, *, env: Mapping[str, str] = os.environ) -> bool:
    r"""Send one notification datagram to systemd.

    Args:
        message: Newline-separated assignments, e.g. ``"READY=1\\nSTATUS=serving"``.
        env: Where to read ``NOTIFY_SOCKET`` from.

    Returns:
        True if the datagram was sent; False without ``NOTIFY_SOCKET`` (not run by systemd) or when sending
        failed. Never raises on send errors: the first failure per address is logged at WARNING.
    """
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    # "@name" is an abstract socket; anything not a path (e.g. systemd >= 253's "vsock:") is unsupported.
    target = "\0" + address[1:] if address.startswith("@") else address
    if not target.startswith(("\0", "/")):
        _warn_once(address, "unsupported address family")
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(1.0)  # never stall the event loop on a wedged service manager
            sock.connect(target)
            sock.sendall(message.encode())
    except OSError as e:
        _warn_once(address, e)
        return False
    return True


def _warn_once(address: str, reason: object) -> None:
    if address not in _warned_addresses:
        _warned_addresses.add(address)
        _log.warning("sd_notify to NOTIFY_SOCKET=%s failed (further failures not logged): %s", address, reason)


def watchdog_interval_from_env(env: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Return the watchdog ping interval in seconds (``WATCHDOG_USEC / 2``), or None if it is off.

    Args:
        env: Where to read ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` from.
        pid: Our pid; defaults to ``os.getpid()``. ``WATCHDOG_PID``, if set, must equal it: the variable is
            meant for the main process, not for a child that inherited the environment.
    """
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
        watchdog_pid = env.get("WATCHDOG_PID")
        if watchdog_pid is not None and int(watchdog_pid) != (os.getpid() if pid is None else pid):
            return None
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier(Protocol):
    """The seam between the daemon and its service manager.

    Implementations never raise on delivery failures: the daemon must serve the same with or without systemd.
    Methods may be called from any thread.
    """

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between watchdog pings (half of WatchdogSec), or None when no watchdog is armed."""
        ...

    def ready(self) -> None:
        """Send ``READY=1``: start-up (engine warm-up) is complete and the daemon serves."""
        ...

    def status(self, text: str) -> None:
        """Send ``STATUS=<text>``, a one-line human-readable state (newlines are replaced by spaces)."""
        ...

    def stopping(self) -> None:
        """Send ``STOPPING=1``: graceful shutdown has begun."""
        ...

    def watchdog(self) -> None:
        """Send ``WATCHDOG=1`` unconditionally. The daemon calls this only through :class:`Watchdog`."""
        ...

    def extend_timeout(self, seconds: float) -> None:
        """Send ``EXTEND_TIMEOUT_USEC``: the start/stop timeout is extended to ``seconds`` from now.

        Re-send it within each extension while a slow step (an engine build) runs.
        """
        ...


class _MessageNotifier:
    """Formats the notify messages once; subclasses only deliver them."""

    def __init__(self, watchdog_interval_s: float | None) -> None:
        self._watchdog_interval_s = watchdog_interval_s

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between watchdog pings, or None when no watchdog is armed."""
        return self._watchdog_interval_s

    def ready(self) -> None:
        """Send ``READY=1``."""
        self._send("READY=1")

    def status(self, text: str) -> None:
        """Send ``STATUS=<text>`` on one line."""
        self._send("STATUS=" + " ".join(text.splitlines()))

    def stopping(self) -> None:
        """Send ``STOPPING=1``."""
        self._send("STOPPING=1")

    def watchdog(self) -> None:
        """Send ``WATCHDOG=1``."""
        self._send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """Send ``EXTEND_TIMEOUT_USEC=<seconds in µs>``.

        Raises:
            ValueError: If ``seconds`` is not positive.
        """
        if not seconds > 0:
            raise ValueError(f"extend_timeout: seconds must be > 0, got {seconds!r}")
        self._send(f"EXTEND_TIMEOUT_USEC={round(seconds * 1e6)}")

    def _send(self, message: str) -> None:
        raise NotImplementedError


class SystemdNotifier(_MessageNotifier):
    """A :class:`Notifier` that sends to ``$NOTIFY_SOCKET`` with :func:`sd_notify`.

    Without ``NOTIFY_SOCKET`` (run by hand, in a container) every method is a silent no-op.

    Args:
        env: The environment to read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` from.
    """

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self._env = env
        super().__init__(watchdog_interval_from_env(env) if env.get("NOTIFY_SOCKET") else None)

    def _send(self, message: str) -> None:
        sd_notify(message, env=self._env)


class NullNotifier(_MessageNotifier):
    """A :class:`Notifier` that sends nothing and arms no watchdog."""

    def __init__(self) -> None:
        super().__init__(None)

    def _send(self, message: str) -> None:
        pass


class RecordingNotifier(_MessageNotifier):
    """A fake :class:`Notifier` that records each message, in order, in :attr:`messages`.

    Args:
        watchdog_interval_s: What :attr:`watchdog_interval_s` reports (None: no watchdog).
    """

    def __init__(self, watchdog_interval_s: float | None = None) -> None:
        super().__init__(watchdog_interval_s)
        self.messages: list[str] = []  # exactly what SystemdNotifier would send, e.g. "READY=1"

    def _send(self, message: str) -> None:
        self.messages.append(message)


class Watchdog:
    """Decides whether to send ``WATCHDOG=1``: only while the engine makes progress.

    The engine thread stamps a heartbeat (``clock_monotonic()`` of its last finished batch or last idle tick).
    The daemon calls :meth:`tick` every ``notifier.watchdog_interval_s`` from the event loop (or awaits
    :meth:`run`). A tick pings only if the heartbeat is at most ``max_staleness_s`` old; otherwise it logs a
    WARNING (at most once per ``warning_interval_s``) and stays silent, so systemd kills and restarts a daemon
    whose engine hangs in a CUDA call while its event loop is still alive.

    Exceptions from ``heartbeat`` propagate: a broken heartbeat must not be mistaken for a live engine.

    Args:
        notifier: Where pings go.
        heartbeat: Returns the engine's last heartbeat, on the ``clock_monotonic`` timescale.
        clock_monotonic: The clock, e.g. ``time.monotonic`` (a manual clock in tests).
        max_staleness_s: Oldest heartbeat that still counts as progress; use half of WatchdogSec.
        warning_interval_s: Minimum time between two "heartbeat stale" warnings.
    """

    def __init__(
        self,
        notifier: Notifier,
        heartbeat: Callable[[], float],
        clock_monotonic: Callable[[], float],
        max_staleness_s: float,
        *,
        warning_interval_s: float = 60.0,
    ) -> None:
        self._notifier = notifier
        self._heartbeat = heartbeat
        self._clock = clock_monotonic
        self._max_staleness_s = max_staleness_s
        self._warning_interval_s = warning_interval_s
        self._last_warning: float | None = None
        self._stale = False

    def tick(self) -> bool:
        """Send ``WATCHDOG=1`` if the heartbeat is fresh; return whether it was sent."""
        now = self._clock()
        age = now - self._heartbeat()
        if age <= self._max_staleness_s:
            if self._stale:
                _log.info("engine heartbeat fresh again; watchdog pings resumed")
                self._stale = False
            self._notifier.watchdog()
            return True
        self._stale = True
        if self._last_warning is None or now - self._last_warning >= self._warning_interval_s:
            self._last_warning = now
            _log.warning(
                "engine heartbeat is %.1f s old (limit %.1f s): withholding WATCHDOG=1, systemd will restart us",
                age,
                self._max_staleness_s,
            )
        return False

    async def run(self, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """Call :meth:`tick` every ``notifier.watchdog_interval_s`` until cancelled.

        Returns at once when the notifier arms no watchdog.
        """
        interval = self._notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.tick()
            await sleep(interval)


@dataclass(frozen=True)
class Notification:
    """One assignment received by :class:`FakeNotifySocket`."""

    message: str  # one "KEY=value" line of a datagram, e.g. "WATCHDOG=1"
    pid: int | None  # sender pid from SCM_CREDENTIALS (what NotifyAccess=main checks); None if unavailable


_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class FakeNotifySocket:
    """Stands in for systemd's notify socket: binds it and collects datagrams in a background thread.

    Use it as a context manager (it is bound and listening from construction; :meth:`close` is idempotent)::

        with FakeNotifySocket() as fake:
            env = {"NOTIFY_SOCKET": fake.address, "WATCHDOG_USEC": "400000"}
            ...  # start the daemon with env
            assert fake.wait_for("READY=1", timeout=30)
            assert fake.wait_for(lambda msgs: msgs.count("WATCHDOG=1") >= 2, timeout=5)

    Args:
        abstract: Bind an abstract socket (``@name``, Linux only) instead of a path in a new temp directory.
    """

    def __init__(self, *, abstract: bool = False) -> None:
        self._tmpdir: str | None = None
        if abstract:
            self.address = f"@appliance-notify-{uuid.uuid4().hex}"
            bind_to = "\0" + self.address[1:]
        else:
            self._tmpdir = tempfile.mkdtemp(prefix="appliance-notify-")
            self.address = bind_to = os.path.join(self._tmpdir, "notify.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            if hasattr(socket, "SO_PASSCRED"):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.bind(bind_to)
            self._sock.settimeout(0.05)  # how quickly close() stops the reader
        except OSError:
            self._cleanup()
            raise
        self._notifications: list[Notification] = []
        self._changed = threading.Condition()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="fake-notify-socket", daemon=True)
        self._reader.start()

    def __enter__(self) -> FakeNotifySocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def messages(self) -> list[str]:
        """Return every assignment received so far, in order, e.g. ``["READY=1", "WATCHDOG=1"]``."""
        with self._changed:
            return [n.message for n in self._notifications]

    def notifications(self) -> list[Notification]:
        """Return every assignment received so far with its sender pid."""
        with self._changed:
            return list(self._notifications)

    def wait_for(self, expected: str | Callable[[list[str]], bool], timeout: float) -> bool:
        """Wait until a message arrives, or a condition on all messages holds.

        Args:
            expected: A message that must appear (``"READY=1"``), or a predicate over :meth:`messages`.
            timeout: Seconds to wait.

        Returns:
            Whether it happened within ``timeout``.
        """
        predicate = expected if callable(expected) else (lambda msgs: expected in msgs)
        with self._changed:
            return self._changed.wait_for(lambda: predicate([n.message for n in self._notifications]), timeout)

    def close(self) -> None:
        """Stop the reader, close the socket and remove its temp directory."""
        self._closing.set()
        if self._reader.is_alive():
            self._reader.join()
        self._cleanup()

    def _cleanup(self) -> None:
        self._sock.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _read_loop(self) -> None:
        while not self._closing.is_set():
            try:
                data, ancdata, _flags, _addr = self._sock.recvmsg(65536, socket.CMSG_SPACE(_CREDS.size))
            except TimeoutError:
                continue
            pid = None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", None):
                    pid = _CREDS.unpack(payload[: _CREDS.size])[0]
            received = [Notification(line, pid) for line in data.decode(errors="replace").splitlines() if line]
            with self._changed:
                self._notifications.extend(received)
                self._changed.notify_all()
