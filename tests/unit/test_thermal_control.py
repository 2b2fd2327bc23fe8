"""The control loop's states (from the governor's enum) and what it tells the health module."""

from __future__ import annotations

import pytest

from appliance.clock import ManualClock
from appliance.thermal.commissioning import governor_settings, setpoint_for_delay
from appliance.thermal.control import HealthAction, ThermalController, ThermalStatus, health_action
from appliance.thermal.fake_pynvml import FakePynvml
from appliance.thermal.governor import GovernorState, ThermalConfig
from appliance.thermal.nvml import NvmlThermometer
from appliance.thermal.plant import Fault, SensorParams
from appliance.thermal.simulated import SimulatedThermometer
from appliance.thermal.source import NoThermometer


def snap(state: GovernorState, reason: str = "r") -> ThermalStatus:
    return ThermalStatus(True, 70.0, 0.5, state.name, 0.0, 0, None, reason, governor_state=state)


@pytest.mark.parametrize(("state", "action"), [
    (GovernorState.DISABLED, HealthAction.SERVE), (GovernorState.COOL, HealthAction.SERVE),
    (GovernorState.REGULATING, HealthAction.SERVE), (GovernorState.THROTTLING, HealthAction.SERVE),
    (GovernorState.HOLDING, HealthAction.SERVE), (GovernorState.BLIND, HealthAction.SERVE_DEGRADED),
    (GovernorState.EMERGENCY, HealthAction.PAUSE), (GovernorState.STOPPED, HealthAction.STOP),
])
def test_health_action_per_state(state: GovernorState, action: HealthAction) -> None:
    got, reason = health_action(snap(state, "stuck: reading frozen"))
    assert got is action and reason == f"thermal {state.name.lower()}: stuck: reading frozen"


def test_every_state_has_an_action() -> None:
    assert {health_action(snap(s))[0] for s in GovernorState} == set(HealthAction)


def test_snapshot_state_is_the_enum_and_its_name() -> None:
    clock = ManualClock()
    used = [1.0]  # full demand: the batcher uses the whole allowance of the previous period
    ctl = ThermalController(SimulatedThermometer(clock, faults=[Fault("stuck", 100.0, 400.0)],
                                                 sensor=SensorParams(1.0, "floor", 0.0)),
                            clock=clock, busy_source=lambda: used[-1])
    seen = set()
    for _ in range(400):
        used.append(ctl.tick())
        s = ctl.snapshot()
        assert s.state == s.governor_state.name and ctl.governor_state is s.governor_state
        seen.add(s.governor_state)
        clock.advance(1.0)
    assert GovernorState.BLIND in seen  # frozen while the die was still warming up: the probe catches it
    assert ctl.thermometer.plant.max_tj < 75.0
    assert health_action(ctl.snapshot())[0] in (HealthAction.SERVE, HealthAction.SERVE_DEGRADED)


def test_lost_gpu_through_nvml_stops() -> None:
    nv = FakePynvml(temperature=65)
    ctl = ThermalController(NvmlThermometer(nvml=nv), clock=ManualClock(), busy_source=lambda: 1.0)
    ctl.tick()
    nv.fail["nvmlDeviceGetTemperatureV"] = nv.NVML_ERROR_GPU_IS_LOST
    ctl.tick()
    assert ctl.governor_state is GovernorState.STOPPED and not ctl.serving and ctl.duty == 0.0
    assert health_action(ctl.snapshot())[0] is HealthAction.STOP


def test_missing_sensor_states() -> None:
    assert ThermalController(NoThermometer(), clock=ManualClock()).governor_state is GovernorState.DISABLED
    blind = ThermalController(NoThermometer("NVML broken"), clock=ManualClock(), require_sensor=True)
    assert blind.governor_state is GovernorState.BLIND and health_action(blind.snapshot())[0] is (
        HealthAction.SERVE_DEGRADED)


def test_setpoint_for_delay() -> None:
    # up to 3 s rated, plus the 0.5 s commissioning adds to its fit
    assert setpoint_for_delay(0.5) == setpoint_for_delay(3.0) == setpoint_for_delay(3.5) == 72.5
    assert setpoint_for_delay(4.5) == 72.25  # a sensor slower than rated: 0.25 °C per second beyond
    assert setpoint_for_delay(15.5) == 69.5
    with pytest.raises(ValueError, match="delay"):
        setpoint_for_delay(-1.0)
    cfg = ThermalConfig(setpoint_c=setpoint_for_delay(3.0))
    assert cfg.setpoint_c < cfg.guard_c


def test_governor_settings_from_a_step_response() -> None:
    out = governor_settings({"ok": True, "tau_s": 3.7, "dead_time_s": 1.0, "r_jh_k_per_w": 0.025}, 545.0)
    assert out == {"die_tau_s": 4.0, "sensor_delay_s": 1.5, "setpoint_c": 72.5, "die_rise_c": 8.17}
    ThermalConfig(**out)  # they are valid [thermal.governor] keys
    assert governor_settings({"ok": False}) == {}
    blind = {"ok": True, "r_total_k_per_w": 0.09}
    out = governor_settings({"ok": True, "tau_s": 3.7, "dead_time_s": 1.0, "r_jh_k_per_w": 0.025}, 545.0, blind)
    assert out["sink_rise_c"] == pytest.approx(0.8 * 0.065 * 545.0, abs=0.01)


class _BlockingThermometer(SimulatedThermometer):
    """A simulated GPU whose read call blocks ``block_s`` of clock time (while the GPU keeps working) when asked."""

    def __init__(self, clock: ManualClock, **kw: object) -> None:
        super().__init__(clock, **kw)  # type: ignore[arg-type]
        self.clock = clock
        self.block_s = 0.0

    def read(self):  # type: ignore[no-untyped-def]
        self.clock.advance(self.block_s)
        self.block_s = 0.0
        return super().read()


def test_a_read_that_blocks_does_not_inflate_the_power_or_blind_a_healthy_sensor() -> None:
    """Held-out review, session 14: a 5 s block stamped before the read made 2,711 W of ~450 W, and BLIND."""
    clock = ManualClock()
    thermo = _BlockingThermometer(clock, sensor=SensorParams(1.0, "floor", 0.0))
    ctl = ThermalController(thermo, clock=clock, busy_source=lambda: 1.0)
    for _ in range(300):
        ctl.tick()
        clock.advance(1.0)
    steady = ctl.snapshot().power_w
    assert steady is not None
    thermo.block_s = 5.0
    ctl.tick()
    blocked = ctl.snapshot().power_w
    assert blocked is not None and blocked < 1.5 * steady
    states = set()
    for _ in range(60):
        clock.advance(1.0)
        ctl.tick()
        states.add(ctl.governor_state)
    assert GovernorState.BLIND not in states


def test_status_keeps_the_last_good_reading_through_failed_reads() -> None:
    """Held-out review, session 14: GetStatus said 0 °C (None) in HOLDING and BLIND, metrics the last value."""
    clock = ManualClock()
    ctl = ThermalController(SimulatedThermometer(clock, faults=[Fault("read_error", 100.0, 130.0)],
                                                 sensor=SensorParams(1.0, "floor", 0.0)),
                            clock=clock, busy_source=lambda: 1.0)
    for _ in range(100):  # t = 0 .. 99: good reads
        ctl.tick()
        clock.advance(1.0)
    good = ctl.snapshot().temperature_c
    assert good is not None and good > 30.0
    seen = set()
    for _ in range(20):
        ctl.tick()
        clock.advance(1.0)
        seen.add(ctl.governor_state)
        assert ctl.snapshot().temperature_c == good
    assert {GovernorState.HOLDING, GovernorState.BLIND} <= seen


def test_status_shows_the_sensor_reading_not_the_governors_lead() -> None:
    """Second thermal review, session 14: in regulation the status temperature was the reading plus the lead and
    unseen-rise terms (62.43 °C for a reading of 61 on a load step)."""
    clock = ManualClock()
    thermo = SimulatedThermometer(clock, sensor=SensorParams(1.0, "floor", 0.0))  # whole degrees
    ctl = ThermalController(thermo, clock=clock, busy_source=lambda: 1.0 if clock.monotonic() >= 120 else 0.0)
    shown = []
    for _ in range(600):
        ctl.tick()
        if ctl.snapshot().temperature_c is not None:
            shown.append(ctl.snapshot().temperature_c)
        clock.advance(1.0)
    assert max(shown) > 60.0  # it regulated (the lead term is non-zero on the way up)
    assert all(float(t).is_integer() for t in shown), sorted({t for t in shown if not float(t).is_integer()})[:5]


def _coarse_counter_run(name: str, update_s: int, seconds: int = 1500) -> tuple[float, float, float]:
    """Full load after 3 idle minutes; NVML's energy counter moves only every ``update_s`` s; the reading freezes 45 s
    into the load for 900 s. Returns seconds above 75 °C, the hottest die and the learned watts per full duty."""
    from appliance.thermal import plant as tp
    from appliance.thermal.governor import Governor
    from appliance.thermal.matrix import matrix_plants

    row = next(r for r in matrix_plants(30, 7) if r.plant.name == name)
    plant = tp.Plant(row.plant, row.room_c, max_delay_s=row.sensor.delay_s + 5)
    sensor = tp.Sensor(row.sensor, 1)
    frozen = tp.FaultInjector([tp.Fault("stuck", 225, 1125)], 1)
    gov = Governor(row.config())
    duty, used, counter = 1.0, 0.0, 0.0
    for t in range(seconds):
        if t % update_s == 0:
            counter = plant.energy_j  # the counter as NVML reports it: updated every update_s seconds
        value, error = frozen.apply(float(t), sensor.read(plant))
        duty = gov.update(float(t), value, None, None if t == 0 else used, energy_j=counter, error=error)
        used = min(0.0 if t < 180 else 1.0, duty)
        plant.advance(1.0, used)
    return plant.seconds_above, plant.max_tj, gov._die.full_w()


def test_an_energy_counter_that_updates_every_few_seconds_gives_the_true_power() -> None:
    """Held-out review, session 18: taken read by read, a counter updated every 3 s gave 0, 0, 3P; the zeros were
    dropped from learning and the 3P kept, so the learned watts came out 2.6-2.9x too high, the die models shrank,
    and a reading that froze was caught 380 s late: 168.8 s above 75 °C on this plant, 77.3 °C."""
    from appliance.thermal.matrix import matrix_plants

    row = next(r for r in matrix_plants(30, 7) if r.plant.name == "rand7-9")
    true_w = row.plant.p_max_w - row.plant.p_idle_w
    above, hottest, learned = _coarse_counter_run("rand7-9", 3)
    assert above == 0.0 and hottest < 75.0
    assert learned == pytest.approx(true_w, rel=0.3)
    assert _coarse_counter_run("rand7-9", 1)[2] == pytest.approx(true_w, rel=0.3)  # an exact counter learns the same
