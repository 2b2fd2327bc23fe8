"""Commissioning steps against the simulated GPU and the fake pynvml (never the real GPU)."""

from __future__ import annotations

import pytest

from appliance.clock import ManualClock
from appliance.thermal import commissioning as cm
from appliance.thermal.fake_pynvml import FakePynvml
from appliance.thermal.nvml import NvmlThermometer
from appliance.thermal.plant import SensorParams
from appliance.thermal.simulated import SimulatedThermometer
from appliance.thermal.source import NoThermometer


def sim() -> tuple[ManualClock, SimulatedThermometer]:
    clock = ManualClock()
    return clock, SimulatedThermometer(clock, sensor=SensorParams(1.0, "floor", 0.0), ambient_c=25.0)


def test_quick_commission_report_is_json_able() -> None:
    import json

    clock, therm = sim()
    rep = cm.commission(therm, clock, therm.note_busy, room_c=25.0, quick=True)
    json.dumps(rep)
    assert rep["ok"] and rep["source"] == "sim"
    assert rep["latency"]["median_ms"] >= 0 and rep["latency"]["p99_ms"] >= rep["latency"]["median_ms"]
    assert rep["update_period"]["changes"] > 3
    step = rep["step_response"]
    assert step["ok"] and 5.0 < step["delta_t_c"] < 40.0 and 1.0 <= step["tau_s"] <= 30.0
    assert step["power_step_w"] == pytest.approx(530, abs=60)
    assert 0.05 <= rep["blind_duty"]["blind_duty"] <= 0.6
    gov = rep["governor"]  # what to store under [thermal.governor]
    assert {"die_tau_s", "sensor_delay_s", "setpoint_c", "die_rise_c"} <= set(gov)
    assert 1.0 <= gov["sensor_delay_s"] <= 4.0 and 72.0 <= gov["setpoint_c"] <= 72.5
    assert 5.0 <= gov["die_rise_c"] <= 20.0


def test_blind_duty_is_safe_in_the_worst_room() -> None:
    clock, therm = sim()
    out = cm.safe_blind_duty(therm, clock, therm.note_busy, 25.0, hold_s=1500.0, worst_room_c=40.0, p_idle_w=30.0)
    u = out["blind_duty"]
    hot_clock = ManualClock()
    hot = SimulatedThermometer(hot_clock, sensor=SensorParams(0.0, "floor", 0.0), ambient_c=40.0)
    hot.note_busy(u)
    hot_clock.advance(4000.0)
    hot.read()
    assert hot.plant.max_tj < 75.0


def test_unavailable_source_reports_why() -> None:
    rep = cm.commission(NoThermometer("no GPU: NVML library not found"), ManualClock(), lambda d: None)
    assert rep == {"ok": False, "reason": "no GPU: NVML library not found"}


def test_power_limit_is_opt_in_and_reports_no_permission() -> None:
    nv = FakePynvml(temperature=50)
    therm = NvmlThermometer(nvml=nv)
    clock = ManualClock()
    rep = cm.commission(therm, clock, lambda d: None, quick=True)
    assert "power_limit" not in rep and "nvmlDeviceSetPowerManagementLimit" not in nv.calls
    assert rep["limits_c"][194] == 91.0
    nv.fail["nvmlDeviceSetPowerManagementLimit"] = 4
    out = cm.set_static_power_limit(therm, 460.0)
    assert not out["ok"] and out["reason"].startswith("no_permission")
    del nv.fail["nvmlDeviceSetPowerManagementLimit"]
    out = cm.set_static_power_limit(therm, 460.0)
    assert out["ok"] and out["new_limit_w"] == 460.0 and out["old_limit_w"] == 575.0
