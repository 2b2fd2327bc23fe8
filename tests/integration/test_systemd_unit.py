"""Offline checks of systemd/edge-appliance.service with ``systemd-analyze`` (no systemd as PID 1 needed).

``verify`` reports unknown keys and unparsable values only as warnings with rc 0, so the tests assert an
empty output too. ``verify`` also requires every Exec*= binary to exist, so it runs on a copy whose commands
point at ``sys.executable``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "edge-appliance.service"
MAX_EXPOSURE = 2.0

pytestmark = [
    pytest.mark.systemd,
    pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"),
]


def _unit_with_existing_binaries(tmp_path: Path, *, enable_power_limit: bool = False) -> Path:
    """Copy the unit into tmp_path with Exec lines pointing at an existing executable."""
    text = UNIT.read_text()
    if enable_power_limit:
        text, n = re.subn(r"^#(ExecStartPre=\+)", r"\1", text, flags=re.M)
        assert n == 1, "the opt-in ExecStartPre=+ power-limit line is missing"
    text, n = re.subn(r"^(ExecStart(?:Pre)?=[-+!@:]*)\S+", rf"\g<1>{sys.executable}", text, flags=re.M)
    assert n >= 1
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    return copy


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *map(str, args)], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("enable_power_limit", [False, True], ids=["as-shipped", "power-limit-enabled"])
def test_unit_verifies_without_any_output(tmp_path: Path, enable_power_limit: bool) -> None:
    unit = _unit_with_existing_binaries(tmp_path, enable_power_limit=enable_power_limit)
    result = _run("verify", "--man=no", unit)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


def test_unit_security_exposure_is_low(tmp_path: Path) -> None:
    unit = _unit_with_existing_binaries(tmp_path)
    result = _run("security", "--offline=true", f"--threshold={round(MAX_EXPOSURE * 10)}", unit)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", output)
    assert match, output
    assert float(match.group(1)) <= MAX_EXPOSURE


def _directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_unit_lifecycle_directives() -> None:
    directives = _directives(UNIT.read_text())
    assert directives["Type"] == ["notify"]
    assert directives["NotifyAccess"] == ["main"]
    assert directives["WatchdogSec"] == ["30s"]
    assert directives["KillMode"] == ["mixed"]
    assert directives["Restart"] == ["on-failure"]
    assert directives["ExecStart"][0].split()[1:] == ["serve", "--config", "/etc/appliance/appliance.toml"]
    assert "ExecStartPre" not in directives, "the privileged power limit must stay opt-in"


def test_unit_network_and_restart_policy() -> None:
    """IP only with loopback by default, no netlink, no restart loop on a config error, grace fits the stop."""
    from appliance.config import RANGES

    text = UNIT.read_text()
    directives = _directives(text)
    assert directives["IPAddressDeny"] == ["any"]
    assert directives["IPAddressAllow"] == ["localhost"]
    assert directives["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert directives["RestartPreventExitStatus"] == ["78"]
    assert directives["RuntimeDirectory"] == ["appliance"]
    assert "ExecReload" not in directives
    assert "SIGHUP reloads" not in text
    timeout = directives["TimeoutStopSec"][0]
    assert timeout.endswith("s")
    assert float(timeout[:-1]) >= RANGES["server.grace_s"][1] + 10


def test_unit_keeps_the_service_when_a_worker_is_oom_killed_and_allows_the_socket_group() -> None:
    """Ops review, session 14: the default OOMPolicy=stop would stop the service (and lose every request in
    flight) when the kernel kills one decoder worker; and chown, needed for server.socket_group, is in
    @privileged, so a configured socket group exited 78 under the unit's system-call filter."""
    lines = [line.split("=", 1)[1] for line in UNIT.read_text().splitlines() if line.startswith("SystemCallFilter=")]
    directives = _directives(UNIT.read_text())
    assert directives["OOMPolicy"] == ["continue"]
    deny = next(i for i, v in enumerate(lines) if v.startswith("~") and "@privileged" in v)
    assert any(v.split() == ["@chown"] for v in lines[deny + 1:])  # allowed again after the deny list


def test_sysusers_snippet_matches_the_unit() -> None:
    snippet = (UNIT.parent / "sysusers.d" / "edge-appliance.conf").read_text()
    directives = _directives(UNIT.read_text())
    user = directives["User"][0]
    assert any(line.split()[:2] == ["u", user] for line in snippet.splitlines())
    for group in directives["SupplementaryGroups"][0].split():
        assert f"m {user} {group}" in snippet
