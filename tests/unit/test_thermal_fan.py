"""A fan that stops: the guard on hot readings in a row, and a stuck verdict that the warming heatsink can fake.

When the fan stops the die climbs while the power stays put, and the governor's die model (which knows only the
power) predicts a fall after every cut it makes. Three rules keep that from letting the die past the wall
(docs/thermal.md, "A fan that stops"): readings at the guard in a row engage the guard whatever the model predicts;
a stuck verdict reached at a duty under the blind duty ramps up to it instead of jumping; and a stuck reading that
moves at or above the guard is recovered at the lowest duty.
"""

from __future__ import annotations

import dataclasses

import pytest

from appliance.thermal import plant as tp
from appliance.thermal.governor import Governor, GovernorState, ThermalConfig
from appliance.thermal.matrix import matrix_plants


def _fan_stop(name: str, sensor_seed: int, seconds: int = 2400, *, draw: int = 7, lag_s: float = 0.0,
              log: list[tuple[float, float, str]] | None = None) -> tuple[float, float]:
    """Full load after 3 idle minutes; the fan stops at 30 min. Returns seconds above 75 °C and the hottest die.

    ``lag_s`` makes the sensor that much later than the one the settings were commissioned on. ``log`` collects
    (die, duty, state) of every second after the stop.
    """
    row = next(r for r in matrix_plants(30, draw) if r.plant.name == name)
    sensor_params = dataclasses.replace(row.sensor, delay_s=row.sensor.delay_s + lag_s)
    plant = tp.Plant(row.plant, row.room_c, max_delay_s=sensor_params.delay_s + 40)
    sensor = tp.Sensor(sensor_params, sensor_seed)
    gov = Governor(row.config())
    duty, energy, used = 1.0, 0.0, 0.0
    for t in range(seconds):
        power = None if t == 0 else plant.energy_j - energy
        energy = plant.energy_j
        duty = gov.update(float(t), sensor.read(plant), power, None if t == 0 else used)
        if t == 1800:
            plant.fan_scale = 0.0
        used = min(0.0 if t < 180 else 1.0, duty)
        plant.advance(1.0, used)
        if log is not None and t >= 1800:
            log.append((plant.tj, duty, gov.state.name))
    return plant.seconds_above, plant.max_tj


def test_a_fan_that_stops_at_full_load_is_held_near_the_limit() -> None:
    """Held-out review, session 14: with the fan stopped at full load the guard capped the budget but the integrator
    stayed above the cap; when the guard let go at a 74 °C reading on a 75 °C die, the duty jumped from 0.11 to 0.48
    and the die climbed again: 84 s above 75 °C on this plant. The integrator now winds down under a sustained guard.
    """
    above, _ = _fan_stop("rand7-8", 1, seconds=3000)
    assert above < 30.0, above


def test_a_fan_that_stops_at_full_load_barely_passes_the_wall() -> None:
    # before (session 16): all 12 runs above 75 °C, 147 s in all, up to 76.75 °C; with the rules: 49 s, 76.12 °C
    runs = [_fan_stop(name, seed) for name in ("rand7-1", "rand7-26", "rand7-10", "rand7-0") for seed in (1, 2, 3)]
    assert sum(above for above, _ in runs) <= 60.0, runs
    assert max(hottest for _, hottest in runs) <= 76.3, runs


def test_readings_past_the_guard_cut_deeper_so_a_fan_stop_behind_a_late_sensor_passes_the_wall_briefly() -> None:
    """Held-out review, session 20: behind a sensor 2 s later than commissioned, a stopped fan kept the die above
    75 °C for up to 31 s, because the guard cut 7 % a second while the readings stood a degree or two past it. Each
    degree that the held readings climbed past guard_c now takes two more guard steps (docs/thermal.md, "Escalating
    guard").
    """
    # before: 31.0, 9.0, 4.0 / 16.0, 9.0, 10.5 / 14.5, 11.0, 13.2 s above (117 s in all); now 8.2, 5.8, 4.0 / 10.0, 7.2,
    # 7.5 / 10.5, 9.0, 14.0 (76 s): the last, a noisy sensor, loses escalation wherever its readings jump (see guard.py)
    runs = [_fan_stop(name, seed, draw=draw, lag_s=2.0)
            for name, draw in (("rand3-25", 3), ("rand7-8", 7), ("rand7-10", 7)) for seed in (1, 2, 3)]
    assert max(above for above, _ in runs) <= 15.0, runs
    assert sum(above for above, _ in runs) <= 85.0, runs


def _paused_on_a_hot_reading(cfg: ThermalConfig) -> tuple[Governor, float, int]:
    """Climb to a reading of 76 °C at full power, then hold it while the governor cuts to its floor and judges it.

    The power follows the duty, so the die model expects a fall that the reading never shows: the verdict a stopped
    fan's warming heatsink can cause. Returns the governor, its duty and the time of the verdict.
    """
    gov = Governor(cfg)
    duty, full_w = 1.0, cfg.p_max_w - cfg.p_idle_w
    for t in range(120):
        reading = min(65.0 + 0.5 * t, 76.0)
        before = duty
        duty = gov.update(float(t), reading, cfg.p_idle_w + duty * full_w, duty)
        if gov.state is GovernorState.BLIND:
            assert gov.last_decision.reason.startswith("stuck: dispatch paused")
            assert before <= cfg.min_duty + 1e-9  # at the floor, or under it: hot at the floor
            return gov, duty, t
    raise AssertionError("no stuck verdict")


def test_a_stuck_verdict_at_the_duty_floor_ramps_up_to_the_blind_duty_instead_of_jumping() -> None:
    # before: the duty went from 0.05 to the blind duty (0.5) on the verdict; with the guard rule alone, a fan that
    # stopped at half demand then took a die at 74.6 °C to 77.45 °C (rand3-0 of draw 3, 104 s above 75 °C)
    cfg = ThermalConfig()
    gov, duty, t0 = _paused_on_a_hot_reading(cfg)
    assert duty <= cfg.min_duty + cfg.recover_ramp_per_s * cfg.period_s + 1e-9
    duties = [duty]
    for t in range(t0 + 1, t0 + 15):
        duties.append(gov.update(float(t), 76.0, cfg.p_idle_w + duties[-1] * (cfg.p_max_w - cfg.p_idle_w), duties[-1]))
        assert gov.state is GovernorState.BLIND
    steps = [b - a for a, b in zip(duties, duties[1:], strict=False)]
    assert all(0.0 <= s <= cfg.recover_ramp_per_s * cfg.period_s + 1e-9 for s in steps), duties
    assert duties[-1] == pytest.approx(cfg.blind_duty)  # a sensor that really is stuck still gets the blind duty


def test_a_blind_governor_whose_sensor_comes_back_hot_recovers_at_the_lowest_duty() -> None:
    cfg = ThermalConfig()
    gov, duty, t0 = _paused_on_a_hot_reading(cfg)
    full_w = cfg.p_max_w - cfg.p_idle_w
    for t in range(t0 + 1, t0 + 20):
        duty = gov.update(float(t), 76.0, cfg.p_idle_w + duty * full_w, duty)
    assert duty == pytest.approx(cfg.blind_duty)
    # the reading moves: the sensor is live, and the die behind it is hotter than the guard
    for k, t in enumerate(range(t0 + 20, t0 + 20 + cfg.recover_samples - 1)):
        duty = gov.update(float(t), 77.0 + 0.5 * (k % 2), cfg.p_idle_w + duty * full_w, duty)
        assert gov.state is GovernorState.BLIND and gov.last_decision.reason.startswith("recovering")
        assert duty == pytest.approx(cfg.min_duty)


def test_a_sensor_that_comes_back_cool_or_after_read_errors_recovers_at_the_blind_duty() -> None:
    # the counterparts: below the guard the blind duty stands while the good samples are counted, and so it does
    # after read errors, hot or not (only a stuck reading that moves is known to be live; a glitch stream's hot
    # readings are not trusted that far)
    cfg = ThermalConfig()
    gov = Governor(cfg)
    full_w = cfg.p_max_w - cfg.p_idle_w
    duty = 1.0
    for t in range(60):
        duty = gov.update(float(t), 70.0 + 0.5 * (t % 2), cfg.p_idle_w + duty * full_w, duty)
    for t in range(60, 60 + int(cfg.hold_s) + 2):
        duty = gov.update(float(t), None, None, duty, error="read_error")
    assert gov.state is GovernorState.BLIND
    duty = gov.update(61.0 + cfg.hold_s + 1, 70.0, cfg.p_idle_w + duty * full_w, duty)
    assert gov.last_decision.reason.startswith("recovering") and duty == pytest.approx(cfg.blind_duty)
    for t in range(70, 70 + int(cfg.hold_s) + 2):
        duty = gov.update(float(t), None, None, duty, error="read_error")
    assert gov.state is GovernorState.BLIND
    duty = gov.update(71.0 + cfg.hold_s + 1, 74.5, cfg.p_idle_w + duty * full_w, duty)
    assert gov.last_decision.reason.startswith("recovering") and duty == pytest.approx(cfg.blind_duty)


def test_a_die_that_the_duty_floor_keeps_above_the_limit_is_paced_under_it() -> None:
    """With its fan stopped, rand9-3 settles at 79.8 °C at min_duty (62 °C idle). The governor held min_duty and the
    die crept up to 77.4 °C; EMERGENCY (a reading >= 77 °C for 10 s) paused it only there: 1,289 s above 75 °C in the
    hour. Hot at the floor, the PI now goes under min_duty (docs/thermal.md, "Hot at the floor")."""
    row = next(r for r in matrix_plants(30, 9) if r.plant.name == "rand9-3")
    cfg = row.config()
    assert tp.steady_die_c(row.plant, cfg.min_duty, row.room_c, 0.0) > 77.0  # the floor is not safe for this die
    assert tp.steady_die_c(row.plant, 0.0, row.room_c, 0.0) < 70.0  # idle is
    log: list[tuple[float, float, str]] = []
    above, hottest = _fan_stop("rand9-3", 1, seconds=3600, draw=9, log=log)
    assert above <= 5.0 and hottest < 75.5, (above, hottest)
    later = log[300:]  # after the first rise: the die stays under the limit, and work still goes through
    assert max(die for die, _, _ in later) < 75.0
    assert all(state == "THROTTLING" for _, _, state in later)  # paced, never EMERGENCY (NOT_SERVING)
    assert 0.0 < sum(duty for _, duty, _ in later) / len(later) < cfg.min_duty
