"""Closed-loop simulation: the 24 h acceptance profile, oracles and metrics.

:func:`run_profile` closes the loop through :class:`~appliance.thermal.governor.Governor` at 1 Hz on a
:class:`~appliance.thermal.plant.Plant` and :func:`evaluate` scores it against two oracles: the best constant
duty and an ideal tracker that holds the true die at exactly the limit (``docs/thermal.md``). The command
line lives in :mod:`appliance.thermal.simcli`, the fault matrix in :mod:`appliance.thermal.matrix`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from appliance.thermal.governor import Governor, GovernorState, ThermalConfig
from appliance.thermal.plant import Fault, FaultInjector, Plant, PlantParams, Sensor, SensorParams

_REGULATING = (GovernorState.THROTTLING, GovernorState.REGULATING)

__all__ = [
    "FAULT_KINDS",
    "Profile",
    "SimResult",
    "Targets",
    "best_constant_duty",
    "day_profile",
    "evaluate",
    "fault_schedule",
    "ideal_tracker",
    "peak_to_peak",
    "run_profile",
    "settling_times",
]

FAULT_KINDS = ("none", "read_error", "stuck", "stuck_load", "garbage", "lost")


@dataclass
class Profile:
    """Per-second schedules of demand, room temperature and fan health."""

    # Work demanded per second, as a fraction of full speed.
    demand: list[float]
    # Room temperature, °C.
    ambient: list[float]
    # Fan health: 1.0 healthy, 0.6 degraded.
    fan_scale: list[float]
    # Sensor faults.
    faults: list[Fault] = field(default_factory=list)


def day_profile(hours: float = 24.0, seed: int = 1, time_scale: float | None = None) -> Profile:
    """Return the 24 h acceptance profile (docs/thermal.md), compressed to ``hours``.

    Phases (in profile hours): 0–1 full load at 25 °C; 1–3 random bursts; a step to 35 °C at 3:00
    with full load, an idle hour 5–6, a burst after idle at 6:00, the fan degraded to 60 % 7–9; a step
    back to 25 °C at 9:00; a ramp 25 → 35 °C 11–13; a step to 25 °C at 14:00 with random bursts;
    HVAC cycling 28 ± 2 °C 16–19; an idle hour; a night of random demand 20–24.
    """
    scale = time_scale if time_scale is not None else hours / 24.0
    rng = random.Random(seed)
    n = int(round(24 * 3600 * scale))
    demand, ambient, fan = [1.0] * n, [25.0] * n, [1.0] * n

    def span(h0: float, h1: float) -> range:
        return range(min(int(h0 * 3600 * scale), n), min(int(h1 * 3600 * scale), n))

    def bursts(h0: float, h1: float, lo: float, hi: float, random_level: bool) -> None:
        r = span(h0, h1)
        i = r.start
        on = True
        while i < r.stop:
            length = rng.randint(60, 600)
            level = rng.uniform(lo, hi) if random_level else (1.0 if on else rng.uniform(0.0, 0.2))
            for j in range(i, min(i + length, r.stop)):
                demand[j] = level
            i += length
            on = not on

    bursts(1, 3, 0, 1, False)
    for i in span(3, 9):
        ambient[i] = 35.0
    for i in span(5, 6):
        demand[i] = 0.02
    for i in span(7, 9):
        fan[i] = 0.6
    r = span(11, 13)
    for i in r:
        ambient[i] = 25.0 + 10.0 * (i - r.start) / max(len(r), 1)
    for i in span(13, 14):
        ambient[i] = 35.0
    bursts(14, 16, 0, 1, False)
    for i in span(16, 19):
        ambient[i] = 28.0 + 2.0 * math.sin(2 * math.pi * i / 1800.0)
    for i in span(19, 20):
        demand[i] = 0.0
    bursts(20, 24, 0.0, 1.0, True)
    return Profile(demand, ambient, fan)


def fault_schedule(kind: str, n_s: int, time_scale: float = 1.0) -> list[Fault]:
    """Return the faults of ``kind`` placed on the day profile (times scale, durations do not)."""
    if kind not in FAULT_KINDS:
        raise ValueError(f"--fault must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
    h = 3600.0 * time_scale
    faults = {
        "none": [],
        # short, medium and long outages; the long one spans the burst after idle (6:00)
        "read_error": [Fault("read_error", 3.5 * h, 3.5 * h + 2), Fault("read_error", 4.0 * h, 4.0 * h + 10),
                       Fault("read_error", 6.0 * h - 120, 6.0 * h + 600),
                       Fault("read_error", 12.0 * h, 12.0 * h + 300)],
        # frozen at steady load (35 °C room), then again while throttled at 25 °C
        "stuck": [Fault("stuck", 4.0 * h, 4.0 * h + 900), Fault("stuck", 10.0 * h, 10.0 * h + 900)],
        # frozen while idle and cool, across the idle -> full load step at 6:00
        "stuck_load": [Fault("stuck", 6.0 * h - 300, 6.0 * h + 1200)],
        "garbage": [Fault("garbage", 3.2 * h, 9.0 * h), Fault("garbage", 16 * h, 17 * h)],
        "lost": [Fault("lost", 4.0 * h, math.inf)],
    }[kind]
    return [f for f in faults if f.start_s < n_s]



@dataclass
class SimResult:
    """A closed-loop run: 1 Hz traces and the plant's true extremes."""

    # True die at each control instant, °C.
    die: list[float]
    # Reading given to the governor (None = failed read).
    reading: list[float | None]
    # Duty returned by the governor.
    duty: list[float]
    # Busy fraction actually used.
    busy: list[float]
    # Governor state after each update.
    state: list[GovernorState]
    # Seconds of true die above the limit (at integration resolution).
    seconds_above: float
    # Highest true die, °C.
    max_die_c: float
    # Work done / work demanded.
    served: float
    # The governor's reason after each update (e.g. "stuck: probe changed nothing").
    reason: list[str] = field(default_factory=list)


def run_profile(profile: Profile, plant: PlantParams | None = None, sensor: SensorParams | None = None,
                config: ThermalConfig | None = None, seed: int = 0, measure_power: bool = True,
                limit_c: float = 75.0) -> SimResult:
    """Close the loop: governor at 1 Hz, plant at ``dt`` = 0.25 s, the batcher's duty = min(demand, duty)."""
    sp = sensor or SensorParams()
    p = Plant(plant, profile.ambient[0], max_delay_s=sp.delay_s + 1, limit_c=limit_c)
    sens = Sensor(sp, seed)
    gov = Governor(config)
    die: list[float] = []
    readings: list[float | None] = []
    duties: list[float] = []
    busies: list[float] = []
    states: list[GovernorState] = []
    reasons: list[str] = []
    faults = FaultInjector(profile.faults, seed)
    duty, busy, energy0 = 1.0, 0.0, 0.0
    done = want = 0.0
    for t, demand in enumerate(profile.demand):
        p.ambient_c, p.fan_scale = profile.ambient[t], profile.fan_scale[t]
        value, err = faults.apply(float(t), sens.read(p))
        power = p.energy_j - energy0 if t > 0 else None
        energy0 = p.energy_j
        duty = gov.update(float(t), value, power if measure_power else None, busy if t > 0 else None,
                          error=err)
        busy = min(demand, duty)
        die.append(p.tj)
        readings.append(value)
        duties.append(duty)
        busies.append(busy)
        states.append(gov.state)
        reasons.append(gov.last_decision.reason)
        p.advance(1.0, busy)
        done += busy
        want += demand
    return SimResult(die, readings, duties, busies, states, p.seconds_above, p.max_tj, done / max(want, 1e-9),
                     reasons)


def _open_loop(profile: Profile, plant: PlantParams | None, duty: float, track_c: float | None,
               limit_c: float, stop_above: bool) -> tuple[float, float]:
    p = Plant(plant, profile.ambient[0], limit_c=limit_c)
    done = want = 0.0
    for t, demand in enumerate(profile.demand):
        p.ambient_c, p.fan_scale = profile.ambient[t], profile.fan_scale[t]
        busy = min(demand, duty)
        before = p.busy_s
        peak = p.advance(1.0, busy, track_c)
        if stop_above and peak > limit_c:
            return peak, 0.0
        if track_c is not None:  # work done = the busy the tracker actually allowed (counted by the plant; the
            busy = p.busy_s - before  # energy-based count ignored the power limit's cap and undercounted it)
        done += busy
        want += demand
    return p.max_tj, done / max(want, 1e-9)


def best_constant_duty(
    profile: Profile, plant: PlantParams | None = None, limit_c: float = 75.0
) -> tuple[float, float]:
    """Return (duty, served) of the largest constant duty that keeps the true die <= limit all day."""
    lo, hi = 0.0, 1.0
    if _open_loop(profile, plant, 1.0, None, limit_c, True)[0] <= limit_c:
        lo = 1.0
    else:
        for _ in range(11):
            mid = (lo + hi) / 2
            if _open_loop(profile, plant, mid, None, limit_c, True)[0] <= limit_c:
                lo = mid
            else:
                hi = mid
    return lo, _open_loop(profile, plant, lo, None, limit_c, False)[1]


def ideal_tracker(profile: Profile, plant: PlantParams | None = None, limit_c: float = 75.0) -> float:
    """Return the served fraction of a tracker that knows the true die and holds exactly ``limit_c``."""
    return _open_loop(profile, plant, 1.0, limit_c, limit_c, False)[1]


def peak_to_peak(result: SimResult, profile: Profile, window_s: int = 300, quiet_s: int = 300,
                 ambient_tol_c: float = 0.0) -> list[float]:
    """Return the true-die peak-to-peak of each settled window, °C.

    A window is settled when, over it and the ``quiet_s`` before it, demand is full, the room stays
    within ``ambient_tol_c`` of its value at the start (a slow drift is allowed), the fan is constant,
    and the governor is regulating or throttling the whole time.
    """
    out = []
    n = len(result.die)
    for start in range(quiet_s, n - window_s + 1, window_s):
        lo, hi = start - quiet_s, start + window_s
        amb, fan = profile.ambient[lo], profile.fan_scale[lo]
        if any(profile.demand[i] < 0.999 or abs(profile.ambient[i] - amb) > ambient_tol_c
               or profile.fan_scale[i] != fan
               for i in range(lo, hi)):
            continue
        if any(result.state[i] not in _REGULATING for i in range(start, hi)):
            continue
        seg = result.die[start:hi]
        out.append(max(seg) - min(seg))
    return out


def settling_times(result: SimResult, profile: Profile, band: float = 0.03, horizon_s: int = 900,
                   smooth_s: int = 30) -> list[tuple[int, float]]:
    """Return (step second, settle seconds) for each ambient step of >= 5 °C under full demand.

    The duty is smoothed over ``smooth_s`` (the PI moves it by ≈ 0.05 per 1 °C quantisation step);
    its final value is the mean over the last third of ``horizon_s``; settling ends at the last
    sample outside ±``band`` of it.
    """
    out = []
    n = len(result.duty)
    for i in range(1, n - horizon_s):
        if abs(profile.ambient[i] - profile.ambient[i - 1]) < 5.0:
            continue
        if any(d < 0.999 for d in profile.demand[i:i + horizon_s]):
            continue
        smooth = []
        acc = 0.0
        for j in range(i - smooth_s, i + horizon_s):
            acc += result.duty[j]
            if j - smooth_s >= i - smooth_s:
                acc -= result.duty[j - smooth_s]
            if j >= i:
                smooth.append(acc / smooth_s)
        tail = smooth[2 * horizon_s // 3:]
        final = sum(tail) / len(tail)
        last_out = max((k + 1 for k, d in enumerate(smooth) if abs(d - final) > band), default=0)
        out.append((i, float(last_out)))
    return out


@dataclass(frozen=True)
class Targets:
    """The acceptance targets of the issue."""

    # Seconds of true die above the limit allowed.
    max_seconds_above: float = 0.0
    # Served / ideal tracker.
    min_ratio_ideal: float = 0.90
    # Served / best constant duty ("well above").
    min_ratio_constant: float = 1.15
    # Die peak-to-peak in settled windows, °C.
    max_peak_to_peak_c: float = 1.5
    # Duty settling after an ambient step, s.
    max_settle_s: float = 300.0


def evaluate(profile: Profile, plant: PlantParams | None = None, sensor: SensorParams | None = None,
             config: ThermalConfig | None = None, seed: int = 0, measure_power: bool = True,
             fault: str = "none", targets: Targets | None = None) -> dict[str, object]:
    """Run the governor and both oracles on ``profile`` and score the targets; JSON-able."""
    cfg = config or ThermalConfig()
    tg = targets or Targets()
    limit = cfg.limit_c
    res = run_profile(profile, plant, sensor, cfg, seed, measure_power, limit)
    metrics: dict[str, object] = {
        "seconds_above_limit": round(res.seconds_above, 2),
        "max_die_c": round(res.max_die_c, 3),
        "readings_at_or_above_limit": sum(1 for r in res.reading if r is not None and limit <= r <= 110),
        "served": round(res.served, 4),
        "blind_samples": res.state.count(GovernorState.BLIND),
        "hold_samples": res.state.count(GovernorState.HOLDING),
        "stopped_samples": res.state.count(GovernorState.STOPPED),
        "emergency_samples": res.state.count(GovernorState.EMERGENCY),
    }
    checks: dict[str, bool] = {"seconds_above": res.seconds_above <= tg.max_seconds_above}
    if fault == "none":
        u_const, served_const = best_constant_duty(profile, plant, limit)
        ideal = ideal_tracker(profile, plant, limit)
        pp = peak_to_peak(res, profile)
        settle = settling_times(res, profile)
        metrics.update({
            "constant_duty": round(u_const, 4), "constant_served": round(served_const, 4),
            "ideal_served": round(ideal, 4),
            "ratio_ideal": round(res.served / ideal, 4),
            "ratio_constant": round(res.served / max(served_const, 1e-9), 4),
            "peak_to_peak_c": round(max(pp), 3) if pp else None,
            "settled_windows": len(pp),
            "settle_s": [s for _, s in settle],
        })
        checks.update({
            "ratio_ideal": res.served / ideal >= tg.min_ratio_ideal,
            "ratio_constant": res.served >= tg.min_ratio_constant * served_const,
            "peak_to_peak": not pp or max(pp) <= tg.max_peak_to_peak_c,
            "settle": all(s <= tg.max_settle_s for _, s in settle),
            "no_blind_on_healthy_sensor": metrics["blind_samples"] == 0 and metrics["stopped_samples"] == 0,
        })
    elif fault == "lost":
        first = min(f.start_s for f in profile.faults)
        after = range(int(math.ceil(first)), len(res.duty))
        checks["lost_stops"] = all(res.duty[i] == 0.0 and res.state[i] is GovernorState.STOPPED for i in after)
    elif fault in ("stuck", "stuck_load", "read_error", "garbage"):
        checks["detected"] = metrics["blind_samples"] > 0 or metrics["hold_samples"] > 0  # type: ignore[operator]
    return {"metrics": metrics, "checks": checks, "passed": all(checks.values()), "result": res}
