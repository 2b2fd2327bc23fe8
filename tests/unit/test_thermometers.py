"""Thermometers against the fake pynvml, the simulated plant, and the controller loop."""

from __future__ import annotations

import pytest

from appliance.clock import ManualClock
from appliance.governor import Governor, ThermalConfig
from appliance.thermal.control import ThermalController
from appliance.thermal.fake_pynvml import FakePynvml
from appliance.thermal.nvml import NVML_ERRORS, NvmlThermometer
from appliance.thermal.plant import Fault, SensorParams
from appliance.thermal.simulated import SimulatedThermometer
from appliance.thermal.source import NoThermometer, make_thermometer

# code, error kind expected in Reading.error when the temperature read fails with it
TEMPERATURE_ERRORS = [
    (1, "uninitialized"),
    (3, "not_supported"),
    (4, "no_permission"),
    (9, "lost"),
    (10, "timeout"),
    (15, "lost"),
    (16, "reset_required"),
    (27, "read_error"),
    (999, "unknown"),
    (2, "stale_handle"),  # INVALID_ARGUMENT: a handle gone stale; NVML is opened again after a few (session 19)
]


@pytest.mark.parametrize(("code", "kind"), TEMPERATURE_ERRORS, ids=[str(c) for c, _ in TEMPERATURE_ERRORS])
def test_temperature_error_mapping(code: int, kind: str) -> None:
    nv = FakePynvml(temperature=66)
    therm = NvmlThermometer(nvml=nv)
    nv.fail["nvmlDeviceGetTemperatureV"] = code
    nv.fail["nvmlDeviceGetTemperature"] = code
    r = therm.read()
    assert r.temp_c is None and r.error == kind
    if kind in ("lost", "reset_required"):
        assert r.power_w is None


def test_every_documented_code_has_a_meaning() -> None:
    for code in (3, 4, 9, 10, 12, 13, 15, 16, 26, 27, 999):
        assert code in NVML_ERRORS and NVML_ERRORS[code][2]


@pytest.mark.parametrize("code", [13, 26])
def test_temperature_v_falls_back(code: int) -> None:
    nv = FakePynvml(temperature=61)
    therm = NvmlThermometer(nvml=nv)
    nv.fail["nvmlDeviceGetTemperatureV"] = code
    assert therm.read().temp_c == 61.0
    assert therm.read().temp_c == 61.0
    assert "nvmlDeviceGetTemperature" in nv.calls


def test_reads_power_energy_reasons() -> None:
    nv = FakePynvml(temperature=70, power_mw=321_000)
    nv.energy_mj = 5_000_000
    nv.clock_reasons = 0x4
    r = NvmlThermometer(nvml=nv).read()
    assert (r.temp_c, r.power_w, r.energy_j, r.clock_reasons, r.error) == (70.0, 321.0, 5000.0, 0x4, None)


@pytest.mark.parametrize("code", [3, 4, 13])
def test_secondary_not_supported_drops_the_feature(code: int) -> None:
    nv = FakePynvml(temperature=70)
    therm = NvmlThermometer(nvml=nv)
    nv.fail["nvmlDeviceGetPowerUsage"] = code
    r = therm.read()
    assert r.temp_c == 70.0 and r.power_w is None and r.error is None
    n = nv.calls.count("nvmlDeviceGetPowerUsage")
    therm.read()
    assert nv.calls.count("nvmlDeviceGetPowerUsage") == n  # not polled again


def test_a_secondary_call_that_said_not_supported_is_tried_again_later() -> None:
    """Held-out review, session 14: one transient NOT_SUPPORTED dropped the measured power for good."""
    nv = FakePynvml(temperature=70)
    therm = NvmlThermometer(nvml=nv)
    nv.fail["nvmlDeviceGetPowerUsage"] = 3
    assert therm.read().power_w is None
    del nv.fail["nvmlDeviceGetPowerUsage"]
    powers = [therm.read().power_w for _ in range(400)]
    assert powers[0] is None and powers[-1] == 100.0
    assert 250 <= powers.index(100.0) <= 310  # about five minutes of reads at 1 Hz


def test_secondary_transient_error_keeps_feature_and_lost_wins() -> None:
    nv = FakePynvml(temperature=70)
    therm = NvmlThermometer(nvml=nv)
    nv.fail_once["nvmlDeviceGetPowerUsage"] = 10
    assert therm.read().power_w is None
    assert therm.read().power_w == 100.0
    nv.fail_once["nvmlDeviceGetTotalEnergyConsumption"] = 15
    assert therm.read().error == "lost"


def test_clock_reasons_fallback_to_throttle_reasons() -> None:
    nv = FakePynvml()
    nv.missing.add("nvmlDeviceGetCurrentClocksEventReasons")
    therm = NvmlThermometer(nvml=nv)
    therm.read()
    assert therm.read().clock_reasons == 0x1


def test_field_values_checked_per_field() -> None:
    nv = FakePynvml()
    nv.field_errors[196] = 3
    nv.field_errors[195] = 15
    out = NvmlThermometer(nvml=nv).read_fields([193, 194, 195, 196, 999])
    assert out == {193: 98.0, 194: 91.0, 195: "lost", 196: "not_supported", 999: "not_supported"}


@pytest.mark.parametrize(
    ("init_error", "count", "why"),
    [
        (12, 1, "no GPU: NVML library not found"),
        (9, 1, "no GPU: NVIDIA driver not loaded"),
        (None, 0, "no GPU: NVML reports 0 device(s)"),
    ],
)
def test_cpu_only_box_is_unavailable(init_error: int | None, count: int, why: str) -> None:
    nv = FakePynvml(device_count=count, init_error=init_error)
    therm = make_thermometer("auto", nvml=nv)
    assert isinstance(therm, NoThermometer) and not therm.available
    assert therm.why_unavailable.startswith(why)
    ctl = ThermalController(therm, clock=ManualClock())
    snap = ctl.snapshot()
    assert (snap.enabled, snap.state, snap.duty, ctl.tick(), ctl.serving, ctl.degraded) == (
        False,
        "DISABLED",
        1.0,
        1.0,
        True,
        False,
    )
    assert snap.reason.startswith("no GPU")


def test_real_pynvml_on_this_box_does_not_raise() -> None:
    therm = make_thermometer("auto")
    assert therm.available or therm.why_unavailable
    therm.close()


def test_factory_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="auto, nvml, none, sim"):
        make_thermometer("ir-camera")
    with pytest.raises(ValueError, match="clock"):
        make_thermometer("sim")


def test_none_thermometer_disables_the_governor() -> None:
    ctl = ThermalController(make_thermometer("none"), clock=ManualClock())
    assert ctl.snapshot().state == "DISABLED" and ctl.duty == 1.0 and not ctl.snapshot().enabled


def test_require_sensor_goes_blind() -> None:
    ctl = ThermalController(NoThermometer("NVML broken"), clock=ManualClock(), require_sensor=True)
    assert ctl.state == "BLIND" and ctl.duty == ctl.governor.config.blind_duty and ctl.degraded


def test_controller_with_simulated_gpu_regulates_and_reports() -> None:
    clock = ManualClock()
    therm = SimulatedThermometer(clock, ambient_c=35.0, sensor=SensorParams(2.0))
    used: list[float] = []
    ctl = ThermalController(therm, Governor(ThermalConfig()), clock, busy_source=lambda: used[-1] if used else 0.0)
    for _ in range(1800):
        ctl.tick()
        used.append(ctl.duty)  # full demand: the batcher uses the whole allowance
        clock.advance(1.0)
    snap = ctl.snapshot()
    assert snap.enabled and snap.state == "THROTTLING" and ctl.degraded and ctl.serving
    assert therm.plant.max_tj < 75.0 and snap.seconds_above_limit == 0.0
    assert 0.3 < snap.duty < 0.95 and snap.power_w and snap.temperature_c is not None
    assert snap.throttled_seconds > 1000


def test_controller_lost_gpu_stops() -> None:
    clock = ManualClock()
    therm = SimulatedThermometer(clock, faults=[Fault("lost", 30.0, float("inf"))])
    ctl = ThermalController(therm, clock=clock, busy_source=lambda: 1.0)
    for _ in range(40):
        ctl.tick()
        clock.advance(1.0)
    assert ctl.state == "STOPPED" and ctl.duty == 0.0 and not ctl.serving
    assert ctl.snapshot().errors_by_kind == {"lost": 10}


def test_sim_plant_follows_clock_and_busy() -> None:
    clock = ManualClock()
    therm = SimulatedThermometer(clock, sensor=SensorParams(0.0, "floor", 0.0))
    therm.note_busy(1.0)
    clock.advance(60.0)
    hot = therm.read()
    assert hot.temp_c is not None and hot.temp_c > 50 and hot.power_w is not None and hot.power_w > 500
    therm.note_busy(0.0)
    clock.advance(60.0)
    cool = therm.read()
    assert cool.temp_c is not None and cool.temp_c < hot.temp_c and cool.power_w is not None and cool.power_w < 40


def test_the_simulated_power_is_the_average_since_the_last_read() -> None:
    """Session 22: the daemon notes the busy fraction (which advances the plant) just before it reads; the first
    read divided the energy since start by the microseconds in between and gave a daemon's models 7795 W."""
    clock = ManualClock()
    thermo = SimulatedThermometer(clock)
    for _ in range(3):
        clock.advance(30.0)
        thermo.note_busy(0.0)
        clock.advance(0.001)
        reading = thermo.read()
        assert reading.power_w == pytest.approx(thermo.plant.params.p_idle_w, rel=1e-6)
