"""Tests for appliance.serving.notify: sd_notify against a real (fake) notify socket, the watchdog policy, the fakes."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.serving.notify import (
    FakeNotifySocket,
    Notifier,
    NullNotifier,
    RecordingNotifier,
    SystemdNotifier,
    Watchdog,
    sd_notify,
    watchdog_interval_from_env,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux-only")


class ManualClock:
    """Time moves only when the test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("abstract", [False, pytest.param(True, marks=linux_only)], ids=["path", "abstract"])
def test_sd_notify_reaches_fake_socket(abstract: bool) -> None:
    with FakeNotifySocket(abstract=abstract) as fake:
        assert fake.address.startswith("@" if abstract else "/")
        env = {"NOTIFY_SOCKET": fake.address}
        assert sd_notify("READY=1\nSTATUS=warm", env=env)
        assert sd_notify("WATCHDOG=1", env=env)
        assert fake.wait_for(lambda msgs: len(msgs) == 3, timeout=5)
        assert fake.messages() == ["READY=1", "STATUS=warm", "WATCHDOG=1"]
        if sys.platform.startswith("linux"):
            assert {n.pid for n in fake.notifications()} == {os.getpid()}


def test_fake_socket_close_removes_path_and_is_idempotent() -> None:
    fake = FakeNotifySocket()
    assert os.path.exists(fake.address)
    fake.close()
    fake.close()
    assert not os.path.exists(fake.address)


def test_wait_for_times_out_with_false() -> None:
    with FakeNotifySocket() as fake:
        assert not fake.wait_for("READY=1", timeout=0.05)


def test_sd_notify_without_socket_is_a_noop() -> None:
    assert sd_notify("READY=1", env={}) is False
    assert sd_notify("READY=1", env={"NOTIFY_SOCKET": ""}) is False


def test_sd_notify_send_failure_returns_false_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {"NOTIFY_SOCKET": f"{tmp_path}/missing.sock"}
    with caplog.at_level(logging.WARNING, logger="appliance.serving.notify"):
        assert sd_notify("READY=1", env=env) is False
        assert sd_notify("WATCHDOG=1", env=env) is False
    assert len(caplog.records) == 1
    assert "missing.sock" in caplog.records[0].getMessage()


def test_sd_notify_unsupported_address_returns_false(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="appliance.serving.notify"):
        assert sd_notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"}) is False
    assert "unsupported" in caplog.text


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "4242"}, 0.2),
        ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "4243"}, None),
        ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "not-a-pid"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "garbage"}, None),
        ({}, None),
    ],
    ids=["no-pid", "our-pid", "other-pid", "bad-pid", "zero", "bad-usec", "unset"],
)
def test_watchdog_interval_from_env(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval_from_env(env, pid=4242) == expected


def test_watchdog_interval_defaults_to_our_pid() -> None:
    env = {"WATCHDOG_USEC": "400000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval_from_env(env) == 0.2


def test_systemd_notifier_sends_protocol_messages() -> None:
    with FakeNotifySocket() as fake:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": fake.address, "WATCHDOG_USEC": "400000"})
        assert notifier.watchdog_interval_s == 0.2
        notifier.status("warming up\nengine 1 of 1")
        notifier.extend_timeout(90)
        notifier.ready()
        notifier.watchdog()
        notifier.stopping()
        assert fake.wait_for("STOPPING=1", timeout=5)
        assert fake.messages() == [
            "STATUS=warming up engine 1 of 1",
            "EXTEND_TIMEOUT_USEC=90000000",
            "READY=1",
            "WATCHDOG=1",
            "STOPPING=1",
        ]


def test_systemd_notifier_without_socket_is_silent_and_unarmed() -> None:
    notifier = SystemdNotifier({"WATCHDOG_USEC": "400000"})
    assert notifier.watchdog_interval_s is None
    notifier.ready()
    notifier.watchdog()


def test_recording_notifier_records_what_systemd_would_get() -> None:
    notifier = RecordingNotifier(watchdog_interval_s=0.5)
    assert notifier.watchdog_interval_s == 0.5
    notifier.ready()
    notifier.status("serving")
    notifier.extend_timeout(1.5)
    notifier.stopping()
    assert notifier.messages == ["READY=1", "STATUS=serving", "EXTEND_TIMEOUT_USEC=1500000", "STOPPING=1"]
    with pytest.raises(ValueError, match="seconds must be > 0"):
        notifier.extend_timeout(0)
    assert RecordingNotifier().watchdog_interval_s is None


def test_implementations_satisfy_the_protocol() -> None:
    notifiers: list[Notifier] = [SystemdNotifier({}), NullNotifier(), RecordingNotifier()]
    for notifier in notifiers:
        assert notifier.watchdog_interval_s is None
        notifier.ready()


def test_watchdog_pings_only_while_heartbeat_is_fresh(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    heartbeat = clock.now
    notifier = RecordingNotifier(watchdog_interval_s=15.0)
    watchdog = Watchdog(notifier, lambda: heartbeat, clock, max_staleness_s=15.0, warning_interval_s=60.0)

    assert watchdog.tick()
    clock.now += 15.0  # exactly at the limit still counts
    assert watchdog.tick()
    assert notifier.messages == ["WATCHDOG=1", "WATCHDOG=1"]

    with caplog.at_level(logging.WARNING, logger="appliance.serving.notify"):
        for _ in range(4):  # engine hung: 4 ticks over 30 s, one warning (rate-limited)
            clock.now += 7.5
            assert not watchdog.tick()
    assert notifier.messages == ["WATCHDOG=1", "WATCHDOG=1"]
    assert len(caplog.records) == 1
    assert "withholding WATCHDOG=1" in caplog.records[0].getMessage()

    clock.now += 60.0
    with caplog.at_level(logging.WARNING, logger="appliance.serving.notify"):
        assert not watchdog.tick()
    assert len(caplog.records) == 2  # rate limit elapsed

    heartbeat = clock.now  # engine finished a batch
    assert watchdog.tick()
    assert notifier.messages[-1] == "WATCHDOG=1"
    assert len(notifier.messages) == 3


def test_watchdog_run_ticks_every_interval() -> None:
    clock = ManualClock()
    notifier = RecordingNotifier(watchdog_interval_s=0.2)
    watchdog = Watchdog(notifier, clock, clock, max_staleness_s=0.2)
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(watchdog.run(sleep=fake_sleep))
    assert sleeps == [0.2, 0.2, 0.2]
    assert notifier.messages == ["WATCHDOG=1"] * 3


def test_watchdog_run_returns_when_unarmed() -> None:
    watchdog = Watchdog(NullNotifier(), lambda: 0.0, lambda: 0.0, max_staleness_s=1.0)
    asyncio.run(watchdog.run())


def test_fake_socket_ignores_empty_lines() -> None:
    with FakeNotifySocket() as fake, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"READY=1\n\nSTATUS=x\n", fake.address)
        assert fake.wait_for("STATUS=x", timeout=5)
        assert fake.messages() == ["READY=1", "STATUS=x"]


_CHILD = """
import os
from appliance.serving.notify import sd_notify
assert sd_notify("READY=1")
print(os.getpid())
"""


def test_fake_socket_records_the_sending_process() -> None:
    """What NotifyAccess=main checks: a child's datagram carries the child's pid, not ours."""
    if not sys.platform.startswith("linux"):
        pytest.skip("SCM_CREDENTIALS is Linux-only")
    repo = Path(__file__).resolve().parents[2]
    with FakeNotifySocket() as fake:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD],
            env={**os.environ, "NOTIFY_SOCKET": fake.address, "PYTHONPATH": str(repo)},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert fake.wait_for("READY=1", timeout=5)
        assert [n.pid for n in fake.notifications()] == [int(child.stdout)]
