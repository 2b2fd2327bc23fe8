"""Unit tests of the pure governor with scripted samples (docs/thermal.md)."""

from __future__ import annotations

import copy
import itertools
import random
import statistics

import pytest

from appliance.governor import Governor, GovernorState, ThermalConfig


def drive(
    gov: Governor,
    temps: list[float | None],
    t0: float = 0.0,
    power: float | None = 400.0,
    busy: float | None = 1.0,
    error: str | None = None,
) -> list[float]:
    """Feed one sample per second; return the duties."""
    return [gov.update(t0 + i, t, power, busy, error=error) for i, t in enumerate(temps)]


def test_defaults_and_signature() -> None:
    gov = Governor(ThermalConfig())
    assert gov.config.limit_c == 75.0 and gov.config.setpoint_c < 75.0
    duty = gov.update(0.0, 50.0, power_w=None, busy=None)
    assert duty == 1.0 and gov.state is GovernorState.COOL
    assert gov.last_decision.duty == duty and gov.last_decision.state is gov.state


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("setpoint_c", 76.0),
        ("min_duty", -0.1),
        ("blind_duty", 1.5),
        ("ti_s", 0.0),
        ("p_idle_w", 600.0),
        ("guard_c", 71.0),
        ("recover_samples", 0),
        ("kp_hot_w_per_c", float("nan")),
    ],
)
def test_config_validation_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ThermalConfig(**{field: value})


def test_duty_in_range_and_hotter_never_raises_duty() -> None:
    rng = random.Random(3)
    cfg = ThermalConfig()
    for _ in range(200):
        gov = Governor(cfg)
        drive(
            gov,
            [rng.uniform(60, 74) for _ in range(rng.randint(1, 40))],
            power=rng.uniform(100, 575),
            busy=rng.uniform(0, 1),
        )
        state = gov.state
        t = rng.uniform(60, 76)
        a, b = copy.deepcopy(gov), copy.deepcopy(gov)
        da = a.update(100.0, t, 400.0, 1.0)
        db = b.update(100.0, t + rng.uniform(0.5, 3), 400.0, 1.0)
        for g, d in ((a, da), (b, db)):  # under min_duty only when hot at the floor
            assert cfg.min_duty <= d <= 1.0 or 0.0 <= d and g.last_decision.reason == "hot at the floor", (d, g.state)
        if a.state == b.state and state not in (GovernorState.HOLDING, GovernorState.BLIND):
            assert db <= da + 1e-12


def test_bumpless_start_at_measured_power() -> None:
    gov = Governor()
    duty = gov.update(0.0, 70.0, 400.0, 1.0)
    # budget = measured power at activation (+ one integration step)
    assert gov.last_decision.budget_w == pytest.approx(400.0, abs=5.0)
    assert 0.6 < duty < 0.75


def test_a_restart_on_a_hot_gpu_without_a_power_reading_starts_at_the_blind_duty() -> None:
    """Held-out review, session 14: restarted at 74 °C into full demand with no power measured yet, the PI started
    from full power and the die passed 75 °C for 3 s. With a measured power the start stays bumpless (above)."""
    cfg = ThermalConfig(blind_duty=0.45)
    gov = Governor(cfg)
    assert gov.update(0.0, 74.0, None, None) <= cfg.blind_duty
    measured = Governor(cfg)
    assert measured.update(0.0, 74.0, 500.0, 1.0) > cfg.blind_duty  # a measured full load: bumpless from it


def test_integrator_frozen_during_idle() -> None:
    gov = Governor()
    drive(gov, [73.0] * 120, power=450.0, busy=0.9)  # hot: integrator learns a lower budget
    learned = gov.integral_w
    assert learned is not None
    # 10 min idle: cool reading, tiny busy
    drive(gov, [45.0] * 300 + [62.0] * 300, t0=200, power=40.0, busy=0.02)
    assert gov.integral_w == pytest.approx(learned, abs=1e-9)
    first = gov.update(900.0, 72.0, 40.0, 0.02)
    assert gov.last_decision.budget_w == pytest.approx(learned, abs=1.0)
    assert first < 1.0


def test_demand_limited_does_not_wind_up() -> None:
    gov = Governor()
    drive(gov, [68.0] * 600, power=150.0, busy=0.2)  # cool but demand-limited
    assert gov.integral_w is not None and gov.integral_w < 400.0


def test_error_hold_blind_recover() -> None:
    cfg = ThermalConfig()
    gov = Governor(cfg)
    drive(gov, [72.0] * 30)
    held = gov.duty
    duties = drive(gov, [None] * 6, t0=30)
    assert duties[:3] == [held] * 3 and gov.state is GovernorState.BLIND
    assert duties[-1] == cfg.blind_duty
    duties = drive(gov, [72.0] * 6, t0=36)
    # a 6 s read outage is brief: 2 good samples end BLIND (then the recovery ramp)
    assert duties[:1] == [cfg.blind_duty] and duties[1] > cfg.blind_duty
    assert gov.state in (GovernorState.THROTTLING, GovernorState.REGULATING)


@pytest.mark.parametrize("outage", ["long", "implausible"])
def test_blind_after_a_long_or_implausible_outage_needs_recover_samples(outage: str) -> None:
    cfg = ThermalConfig()
    gov = Governor(cfg)
    drive(gov, [72.0] * 30)
    bad = [None] * 40 if outage == "long" else [None] * 3 + [255.0] + [None] * 2
    drive(gov, bad, t0=30)
    assert gov.state is GovernorState.BLIND
    duties = drive(gov, [72.0] * 6, t0=30 + len(bad))
    assert duties[: cfg.recover_samples - 1] == [cfg.blind_duty] * (cfg.recover_samples - 1)
    assert gov.state in (GovernorState.THROTTLING, GovernorState.REGULATING)


@pytest.mark.parametrize("garbage", [-1.0, 0.0, 127.0, 255.0, float("nan"), 87.0])
def test_implausible_values_are_errors(garbage: float) -> None:
    gov = Governor()
    drive(gov, [72.0] * 10)
    before = gov.sensor_errors
    gov.update(10.0, garbage, 400.0, 1.0)
    assert gov.sensor_errors == before + 1 and gov.state is GovernorState.HOLDING
    drive(gov, [garbage] * 4, t0=11)
    assert gov.state is GovernorState.BLIND


@pytest.mark.parametrize("kind", ["lost", "reset_required"])
def test_lost_stops_at_once_and_for_good(kind: str) -> None:
    gov = Governor()
    drive(gov, [72.0] * 10)
    assert gov.update(10.0, None, error=kind) == 0.0
    assert gov.state is GovernorState.STOPPED
    assert drive(gov, [60.0] * 5, t0=11) == [0.0] * 5 and gov.state is GovernorState.STOPPED


def test_stuck_when_power_moves_and_reading_does_not() -> None:
    gov = Governor()
    drive(gov, [50.0] * 30, power=40.0, busy=0.05)  # idle, cool
    states = []
    for i in range(20):
        gov.update(30.0 + i, 50.0, 560.0, 1.0)
        states.append(gov.state)
    assert GovernorState.BLIND in states
    assert gov.duty == gov.config.blind_duty
    # recovers only after the value moves and recover_samples good samples
    drive(gov, [55.0, 56.0, 57.0, 58.0, 59.0, 60.0], t0=60, power=560.0)
    assert gov.state is not GovernorState.BLIND


def test_stuck_probe_and_no_false_trigger() -> None:
    gov = Governor()
    # 30 min constant reading at constant power, demand-limited (probe can't cut power): no trigger
    drive(gov, [72.0] * 1800, power=300.0, busy=0.3)
    assert GovernorState.BLIND not in {gov.state}
    # frozen reading while the probe cuts power: power follows duty, reading doesn't -> stuck
    gov = Governor(ThermalConfig(probe_after_s=60.0))
    states = []
    for i in range(200):
        duty = gov.duty
        states.append(gov.state)
        gov.update(float(i), 72.0, 30.0 + 545.0 * duty, duty)
    assert GovernorState.BLIND in states


def test_probe_cost_is_small_with_a_live_sensor() -> None:
    gov = Governor()
    duties = []
    for i in range(1800):  # constant reading, full demand: probes every 180 s, reading answers
        t = 72.0 if gov.last_decision.reason != "stuck probe" else 71.0
        duties.append(gov.update(float(i), t, 30.0 + 545 * gov.duty, gov.duty))
    assert GovernorState.BLIND not in {gov.state}
    base = max(duties)
    assert sum(base - d for d in duties) / len(duties) <= 0.02


def test_emergency_pause() -> None:
    gov = Governor()
    drive(gov, [70.0, 71.0, 72.0, 73.0, 74.0] + [77.0] * 60, power=400.0, busy=1.0)
    assert gov.state is GovernorState.EMERGENCY and gov.duty == 0.0
    drive(gov, [76.0, 74.0, 72.0], t0=100)
    assert gov.state is not GovernorState.EMERGENCY


def test_guard_caps_budget() -> None:
    gov = Governor()
    drive(gov, [70.0] * 10, power=400.0)
    gov.update(10.0, 74.0, 400.0, 1.0)
    assert gov.last_decision.budget_w is not None and gov.last_decision.budget_w <= 0.93 * 400.0 + 1e-9


def test_without_power_uses_nameplate_model() -> None:
    gov = Governor()
    duties = drive(gov, [73.0] * 60, power=None, busy=None)
    assert all(0.05 <= d <= 1.0 for d in duties) and duties[-1] < duties[0]


def live(gov: Governor, seconds: int, t0: float = 0.0, base: float = 72.0) -> None:
    """A live, settled sensor: the reading dithers between base and base + 1 every few seconds."""
    for i in range(seconds):
        gov.update(t0 + i, base + (i // 3) % 2, 400.0, gov.duty)


def test_live_boost_grows_only_on_a_live_settled_reading_and_is_bounded() -> None:
    cfg = ThermalConfig(setpoint_c=72.5, guard_c=74.0)
    gov = Governor(cfg)
    live(gov, 600)
    assert gov.boost_c == pytest.approx(cfg.live_boost_c)
    # far below the target (warming up after idle): no boost builds up
    cold = Governor(cfg)
    drive(cold, [62.0 + (i // 3) % 2 for i in range(600)], power=400.0)
    assert cold.boost_c == 0.0


def test_live_boost_is_withdrawn_on_sensor_faults() -> None:
    cfg = ThermalConfig(setpoint_c=72.5, guard_c=74.0)
    gov = Governor(cfg)
    live(gov, 600)
    drive(gov, [None] * 2, t0=600)  # a short gap (HOLDING) keeps it
    assert gov.boost_c > 0.0 and gov.state is GovernorState.HOLDING
    drive(gov, [None] * 3, t0=602)  # past hold_s: BLIND, boost gone
    assert gov.state is GovernorState.BLIND and gov.boost_c == 0.0
    # a frozen reading under a power step: stuck, boost gone
    gov = Governor(cfg)
    live(gov, 600)
    for i in range(30):
        gov.update(600.0 + i, 72.0, 30.0 + 545.0, 1.0)
    assert gov.state is GovernorState.BLIND and gov.boost_c == 0.0


def test_live_boost_shrinks_when_readings_keep_reaching_the_guard() -> None:
    cfg = ThermalConfig(setpoint_c=72.5, guard_c=74.0)
    gov = Governor(cfg)
    live(gov, 600)
    before = gov.boost_c
    # one reading in six at the guard (a noisy or flooring sensor near the wall): the boost shrinks to 0
    for i in range(1200):
        gov.update(600.0 + i, 74.0 if i % 6 == 0 else 72.0 + (i // 3) % 2, 400.0, gov.duty)
    assert before > 0.0 and gov.boost_c == 0.0
    off = Governor(cfg.replace(live_boost_c=0.0))
    live(off, 600)
    assert off.boost_c == 0.0


def test_lead_throttles_a_power_rise_the_sensor_cannot_show_yet() -> None:
    cfg = ThermalConfig(die_rise_c=12.0, die_tau_s=4.0, sensor_delay_s=3.0)
    with_lead, without = Governor(cfg), Governor(cfg.replace(lead_gain=0.0))
    for gov in (with_lead, without):
        drive(gov, [71.0] * 60, power=300.0, busy=0.5)
    assert with_lead.lead_c() == pytest.approx(0.0, abs=1e-6)  # steady power: no lead
    # power jumps; the reading has not moved yet
    a = with_lead.update(60.0, 71.0, 560.0, 1.0)
    b = without.update(60.0, 71.0, 560.0, 1.0)
    assert with_lead.lead_c() > 0.5 and a < b


def test_duty_ramps_up_after_blind_instead_of_jumping() -> None:
    # the die cooled at the blind duty; a jump to full duty followed by one more read error would be held
    # for hold_s on a die the sensor has not seen yet (a held-out matrix plant reached 75.2 °C that way)
    cfg = ThermalConfig(setpoint_c=72.5, guard_c=74.0)
    gov = Governor(cfg)
    live(gov, 120)
    drive(gov, [None] * 5, t0=120)
    assert gov.state is GovernorState.BLIND
    duties = drive(gov, [66.0] * 20, t0=125, power=200.0, busy=None)
    assert duties[0] == cfg.blind_duty  # a brief read outage: 2 good samples end BLIND
    after = duties[1:]
    assert after[0] <= cfg.blind_duty + cfg.recover_ramp_per_s + 1e-9
    assert all(b - a <= cfg.recover_ramp_per_s + 1e-9 for a, b in itertools.pairwise(after))
    assert after[-1] > cfg.blind_duty  # it does come back


def test_noise_filter_calms_the_duty_on_a_noisy_sensor() -> None:
    # a rounding sensor with 0.5 °C noise around the setpoint: without the filter every flip kicks the P term
    rng = random.Random(3)
    temps: list[float | None] = [float(round(72.0 + rng.gauss(0.0, 0.5))) for _ in range(900)]
    spread = {}
    for tau in (0.0, 2.0):
        gov = Governor(ThermalConfig(reading_filter_s=tau, live_boost_c=0.0))
        spread[tau] = statistics.pstdev(drive(gov, temps, power=400.0, busy=1.0)[300:])
    assert spread[2.0] < 0.75 * spread[0.0]


def test_guard_and_integrator_still_see_the_raw_reading() -> None:
    cfg = ThermalConfig()
    gov = Governor(cfg)
    drive(gov, [72.0] * 120)
    before = gov.integral_w
    gov.update(120.0, cfg.guard_c, 400.0, 1.0)  # one reading at the guard: the filter must not hide it
    assert gov.last_decision.reason == "guard"
    assert before is not None and gov.integral_w is not None and gov.integral_w < before


def test_noise_filter_restarts_after_a_gap() -> None:
    # on steady readings the filtered value equals the reading, so a filtered and an unfiltered governor agree;
    # after BLIND they must still agree: the filter restarts from the new reading instead of carrying 72 over
    pair = [Governor(ThermalConfig()), Governor(ThermalConfig(reading_filter_s=0.0))]
    budgets = []
    for gov in pair:
        drive(gov, [72.0] * 60)
        drive(gov, [None] * 40, t0=60)
        budgets.append([])
        for i in range(10):
            gov.update(100.0 + i, 73.5, 400.0, 1.0)
            budgets[-1].append(gov.last_decision.budget_w)
    assert budgets[0][-1] is not None and budgets[0] == budgets[1]


def test_a_stuck_verdict_dips_the_duty_so_a_live_sensor_can_show_itself() -> None:
    cfg = ThermalConfig()
    gov = Governor(cfg)
    drive(gov, [50.0] * 30, power=40.0, busy=0.05)
    duties = [gov.update(30.0 + i, 50.0, 560.0, 1.0) for i in range(400)]  # frozen under a load step
    blind = duties[20:]
    assert max(blind) == cfg.blind_duty  # never above the blind duty
    dipped = [d < cfg.blind_duty - 1e-9 for d in blind]
    assert any(dipped) and sum(dipped) <= len(dipped) * (cfg.stuck_dip_s / cfg.stuck_dip_every_s) + cfg.stuck_dip_s
    assert min(blind) >= cfg.blind_duty * (1 - cfg.probe_max_cut) - 1e-9
    # the dip answered: the value moves, and BLIND ends after recover_samples
    drive(gov, [48.0, 47.0, 47.0, 47.0, 47.0, 47.0], t0=430, power=300.0)
    assert gov.state is not GovernorState.BLIND


@pytest.mark.parametrize("glitch", [-20.0, -15.0, 20.0])
def test_a_glitch_on_the_first_read_does_not_become_the_reference(glitch: float) -> None:
    """Held-out review, session 14: a glitch on the first read, then one every 3 s, was the reference for good.

    The true readings (72-73 °C, hot) were "implausible jumps" that never strung five together; with a -20 °C
    glitch the governor ran full duty on 52 °C and the die sat at the plant's full-load maximum (79.4 °C).
    """
    gov = Governor()
    readings = [72.0 + (t % 2) + (glitch if t % 3 == 0 else 0.0) for t in range(120)]
    regulated_on = []
    for t, reading in enumerate(readings):
        gov.update(float(t), reading, 450.0, 0.9)
        if t >= 30 and gov.last_decision.temp_c is not None:
            regulated_on.append(gov.last_decision.temp_c)
    # never on a glitch; on the true 72-73 °C 2 samples of 3 when the glitches are low, and while hot glitches are
    # interleaved the true readings are disputed (plausible.py: trusting the cooler stream is the unsafe guess)
    assert len(regulated_on) >= (60 if glitch < 0 else 25) and all(71.0 <= t <= 74.5 for t in regulated_on)
    assert gov.duty < 1.0


@pytest.mark.parametrize("recover_samples", [1, 2])
def test_a_small_recover_samples_still_rejects_a_glitch(recover_samples: int) -> None:
    """Session 14's review of the vote: a window of recover_samples = 1 slot never confirmed anything, so every
    reading was "unconfirmed" and used as is; one 18 °C glitch on a 78 °C die took the duty from 0.05 to 1."""
    cfg = ThermalConfig(recover_samples=recover_samples)
    gov = Governor(cfg)
    drive(gov, [78.0] * 60, power=450.0, busy=0.9)
    hot = gov.duty
    assert hot < 0.5
    gov.update(60.0, 18.0, 450.0, 0.9)
    assert gov.duty <= max(hot, cfg.min_duty) + 1e-9  # held (or at most the minimum duty), never full duty


def test_blind_recovers_on_a_sensor_with_an_occasional_spike() -> None:
    """Held-out review, session 14: after a read outage, a +15 °C spike every 5 s reset BLIND's recovery count each
    time, and the governor stayed BLIND (0.68 of ideal) for the rest of the run."""
    cfg = ThermalConfig()
    gov = Governor(cfg)
    drive(gov, [72.0] * 30)
    drive(gov, [None] * 40, t0=30)  # a long outage: BLIND, recover_samples good readings needed
    assert gov.state is GovernorState.BLIND
    after = [72.0 + (15.0 if t % 5 == 0 else 0.0) for t in range(30)]
    drive(gov, after, t0=70)
    assert gov.state is not GovernorState.BLIND


@pytest.mark.parametrize("pattern", ["alternate -11", "every 3rd -10.5"])
def test_a_cooler_stream_interleaved_with_the_true_one_is_never_the_reading(pattern: str) -> None:
    """Second held-out review, session 14: a sensor alternating between the die and 11 °C below gave each stream a
    majority in turn, and the reference slid to the low one whenever the die rose (81.6 °C); a -12 °C glitch every
    third read became the reference once the die had risen a degree (79.6 °C)."""
    gov = Governor()
    used = []
    for t in range(300):
        true = 60.0 + min(t, 150) * 0.1 + (t % 2) * 0.5  # a die warming 0.1 °C/s to 75, then steady
        low = (t % 2 == 0) if pattern == "alternate -11" else (t % 3 == 2)
        gov.update(float(t), true - (11.0 if pattern == "alternate -11" else 10.5) * low, 450.0, 0.9)
        if gov.last_decision.temp_c is not None:
            used.append((t, gov.last_decision.temp_c))
    late = [v for t, v in used if t >= 20]
    assert late and min(late) >= 60.0 + 2.0  # never regulated on the cooler stream (its values run 10-11 °C low)
