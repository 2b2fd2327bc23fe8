"""Commissioning steps against the simulated GPU and the fake pynvml (never the real GPU)."""

from __future__ import annotations

import pytest

from appliance.clock import ManualClock
from appliance.thermal import commissioning as cm
from appliance.thermal.fake_pynvml import FakePynvml
from appliance.thermal.matrix import matrix_plants, matrix_profile
from appliance.thermal.nvml import NvmlThermometer
from appliance.thermal.plant import Fault, PlantParams, SensorParams
from appliance.thermal.sim import ideal_tracker, run_profile
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


def slow_sensor(delay_s: float, plant: PlantParams | None = None, room_c: float = 25.0,
                noise_c: float = 0.25) -> tuple[ManualClock, SimulatedThermometer]:
    clock = ManualClock()
    return clock, SimulatedThermometer(clock, plant, SensorParams(delay_s, "floor", noise_c), ambient_c=room_c, seed=7)


@pytest.mark.parametrize("delay_s", [5.0, 8.0, 12.0])
def test_a_sensor_slower_than_rated_is_commissioned_with_its_own_delay(delay_s: float) -> None:
    # the dead-time fit used to stop at 3 s: a 5-12 s sensor was stored as 3.5 s, with a 28-60 s "die" time constant
    clock, therm = slow_sensor(delay_s)
    rep = cm.commission(therm, clock, therm.note_busy, room_c=25.0)
    step, gov = rep["step_response"], rep["governor"]
    assert rep["ok"] and step["ok"] and not step["dead_time_at_limit"]
    assert delay_s - 1.0 <= step["dead_time_s"] <= delay_s
    assert delay_s <= gov["sensor_delay_s"] <= delay_s + 1.0
    assert gov["die_tau_s"] <= 12.0  # the 5090-like die: 6.5-7.5 s on a rated sensor
    assert gov["setpoint_c"] == cm.setpoint_for_delay(gov["sensor_delay_s"]) < 72.5


def test_a_plant_behind_a_12_s_sensor_stays_under_the_limit_with_what_commissioning_stored() -> None:
    # matrix plant rand7-26 behind a 12 s sensor: commissioned as 3.5 s, the matrix profile ran it 20.8 s above 75 °C
    row = next(r for r in matrix_plants(30, 7) if r.plant.name == "rand7-26")
    sensor = SensorParams(12.0, row.sensor.quantize, row.sensor.noise_c)
    clock = ManualClock()
    therm = SimulatedThermometer(clock, row.plant, sensor, ambient_c=row.room_c, seed=7)
    gov = cm.commission(therm, clock, therm.note_busy, room_c=row.room_c)["governor"]
    cfg = row.config().replace(**{k: gov[k] for k in ("die_tau_s", "sensor_delay_s", "setpoint_c", "die_rise_c")})
    profile = matrix_profile(row.room_c, 3.0, 1)
    res = run_profile(profile, row.plant, sensor, cfg, seed=1)
    assert res.seconds_above == 0.0 and res.max_die_c < 75.0
    assert res.served > 0.75 * ideal_tracker(profile, row.plant)


def test_a_sensor_that_answers_a_step_after_15_s_or_never_is_reported_not_fitted() -> None:
    clock, therm = slow_sensor(20.0)
    rep = cm.commission(therm, clock, therm.note_busy, room_c=25.0)
    assert not rep["ok"] and not rep["step_response"]["ok"] and rep["step_response"]["dead_time_at_limit"]
    assert "15 s or more" in rep["step_response"]["reason"] and rep["governor"] == {}
    clock = ManualClock()  # a reading frozen at 40 °C while the power follows the load
    therm = SimulatedThermometer(clock, sensor=SensorParams(1.0, "floor", 0.25), faults=[Fault("stuck", 0, 1e9, 40.0)])
    step = cm.measure_step_response(therm, clock, therm.note_busy)
    assert step["ok"] is False and "the reading rose 0.0 °C in 27 s of full load" in step["reason"]
    clock, therm = slow_sensor(1.0)
    step = cm.measure_step_response(therm, clock, lambda duty: None)  # the load never reaches the GPU
    assert step["ok"] is False and "the power did not follow the load" in step["reason"]
    assert cm.governor_settings(step) == {}
