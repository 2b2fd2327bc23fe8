"""A simulated GPU thermal plant, the 24 h acceptance profile, oracles and metrics.

The plant (notes ``thermal.md`` §3) is two RC nodes and a stock fan::

    C_j·dT_j/dt = P − (T_j − T_h)/R_jh                       die + vapour chamber (the sensor)
    C_h·dT_h/dt = (T_j − T_h)/R_jh − (g0 + g1·fan)·(T_h − T_amb)
    P = P_idle + u·min(P_dyn·(1 + leak·(T_j − 60)), P_limit − P_idle)
    fan: off below 45 / on above 55 °C (hysteresis), 30 → 100 % from 55 → 85 °C, τ_fan 4 s

integrated with Euler steps of ``dt_s`` (0.25 s) and read by a sensor with delay, noise and integer
quantisation (floor or round). ``run_profile`` closes the loop through :class:`~appliance.governor.Governor`
at 1 Hz and scores it against two oracles: the best constant duty and an ideal tracker that holds the
true die at exactly the limit. ``main`` is the ``appliance thermal-sim`` command and exits 1 when a
target fails, so it doubles as the acceptance check.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from appliance.governor import Governor, ThermalConfig

__all__ = [
    "FAULT_KINDS",
    "PRESETS",
    "Fault",
    "Plant",
    "PlantParams",
    "Profile",
    "Sensor",
    "SensorParams",
    "SimResult",
    "Targets",
    "best_constant_duty",
    "day_profile",
    "evaluate",
    "fault_schedule",
    "ideal_tracker",
    "main",
    "peak_to_peak",
    "run_profile",
    "settling_times",
]

log = logging.getLogger(__name__)

FAULT_KINDS = ("none", "read_error", "stuck", "stuck_load", "garbage", "lost")


@dataclass(frozen=True)
class PlantParams:
    """Physical parameters of the simulated card (notes §3; values are assumptions)."""

    # Preset name, for reports.
    name: str = "5090"
    # Power at duty 0, W.
    p_idle_w: float = 30.0
    # Power at duty 1 at 60 °C, W (total board power).
    p_max_w: float = 575.0
    # Firmware power limit, W (None = p_max_w).
    p_limit_w: float | None = None
    # Die-to-heatsink resistance, K/W.
    r_jh: float = 0.025
    # Die + vapour chamber heat capacity, J/K.
    c_j: float = 150.0
    # Heatsink heat capacity, J/K.
    c_h: float = 800.0
    # Heatsink-to-air conductance with the fan stopped, W/K.
    g0: float = 2.5
    # Extra conductance at 100 % fan, W/K.
    g1: float = 16.5
    # Relative dynamic-power increase per °C above 60 °C (leakage).
    leak_per_c: float = 0.002
    # Fan starts at this die temperature, °C.
    fan_on_c: float = 55.0
    # Fan stops below this die temperature, °C.
    fan_off_c: float = 45.0
    # Fan reaches 100 % at this die temperature, °C.
    fan_full_c: float = 85.0
    # Fan speed when just on, fraction.
    fan_min: float = 0.3
    # Fan time constant, s.
    tau_fan_s: float = 4.0

    def scaled(self, r_jh_scale: float = 1.0, heatsink_scale: float = 1.0, die_scale: float = 1.0) -> PlantParams:
        """Return a copy with R_jh, the heatsink capacity (its τ) and the die capacity scaled."""
        return dataclasses.replace(
            self, r_jh=self.r_jh * r_jh_scale, c_h=self.c_h * heatsink_scale, c_j=self.c_j * die_scale
        )


PRESETS: dict[str, PlantParams] = {
    "5090": PlantParams(),
    "4090": PlantParams("4090", 25.0, 450.0, None, 0.028, 170.0, 1000.0, 3.0, 17.0),
    # A 300 W blower card (RTX PRO 6000 Max-Q-like); rough, for robustness only.
    "pro6000maxq": PlantParams("pro6000maxq", 20.0, 300.0, None, 0.045, 110.0, 600.0, 1.5, 7.0),
}
"""Plant presets by GPU class."""


@dataclass(frozen=True)
class SensorParams:
    """How the simulated NVML sensor distorts the die temperature."""

    # Delay between the die and the reading, s.
    delay_s: float = 1.0
    # Integer quantisation: "floor" (worst case) or "round".
    quantize: str = "floor"
    # Gaussian noise σ before quantisation, °C.
    noise_c: float = 0.25


class Plant:
    """The 2-node RC plant with fan; advance it with the duty the batcher really used.

    Args:
        params: Physical parameters.
        ambient_c: Initial room temperature, °C (the plant starts at rest in it).
        dt_s: Integration step, s.
        max_delay_s: Longest sensor delay the history must serve, s.
        limit_c: Temperature counted for ``seconds_above``, °C.
    """

    def __init__(self, params: PlantParams | None = None, ambient_c: float = 25.0, dt_s: float = 0.25,
                 max_delay_s: float = 5.0, limit_c: float = 75.0) -> None:
        self.params = params or PRESETS["5090"]
        self.dt_s = dt_s
        self.ambient_c = ambient_c
        self.fan_scale = 1.0
        self.limit_c = limit_c
        self.tj = self.th = ambient_c
        self.fan = 0.0
        self.fan_on = False
        self.energy_j = 0.0
        self.power_w = self.params.p_idle_w
        self.max_tj = ambient_c
        self.seconds_above = 0.0
        self._hist: deque[float] = deque([ambient_c] * (int(max_delay_s / dt_s) + 3),
                                         maxlen=int(max_delay_s / dt_s) + 3)

    def advance(self, seconds: float, busy: float, track_c: float | None = None) -> float:
        """Integrate ``seconds`` at busy fraction ``busy``; return the max die temperature seen.

        With ``track_c`` the busy fraction of each step is also capped so the die lands exactly
        on ``track_c`` (the ideal tracker's perfect-knowledge control).
        """
        p = self.params
        n = max(1, int(round(seconds / self.dt_s)))
        h = seconds / n
        tj, th, fan, fan_on = self.tj, self.th, self.fan, self.fan_on
        amb, scale, limit = self.ambient_c, self.fan_scale, self.limit_c
        p_dyn = p.p_max_w - p.p_idle_w
        p_room = (p.p_limit_w or p.p_max_w) - p.p_idle_w
        span = p.fan_full_c - p.fan_on_c
        peak = tj
        for _ in range(n):
            if fan_on:
                fan_on = tj >= p.fan_off_c
            else:
                fan_on = tj >= p.fan_on_c
            if fan_on:
                x = min(max((tj - p.fan_on_c) / span, 0.0), 1.0)
                cmd = (p.fan_min + (1.0 - p.fan_min) * x) * scale
            else:
                cmd = 0.0
            fan += (cmd - fan) * h / p.tau_fan_s
            dyn = min(p_dyn * (1.0 + p.leak_per_c * (tj - 60.0)), p_room)
            q = (tj - th) / p.r_jh
            u = busy
            if track_c is not None:
                need = ((track_c - tj) * p.c_j / h + q - p.p_idle_w) / dyn
                u = min(max(need, 0.0), busy)
            power = p.p_idle_w + u * dyn
            tj += h * (power - q) / p.c_j
            th += h * (q - (p.g0 + p.g1 * fan) * (th - amb)) / p.c_h
            self.energy_j += power * h
            self._hist.append(tj)
            if tj > peak:
                peak = tj
            if tj > limit + 1e-9:
                self.seconds_above += h
        self.tj, self.th, self.fan, self.fan_on, self.power_w = tj, th, fan, fan_on, power
        self.max_tj = max(self.max_tj, peak)
        return peak

    def die_delayed(self, delay_s: float) -> float:
        """Return the die temperature ``delay_s`` ago (linear interpolation), °C."""
        k = delay_s / self.dt_s
        i = int(k)
        hist = self._hist
        if i + 1 >= len(hist):
            return hist[0]
        a, b = hist[-1 - i], hist[-2 - i]
        return a + (b - a) * (k - i)


class Sensor:
    """An NVML-like integer temperature sensor reading a :class:`Plant`."""

    def __init__(self, params: SensorParams | None = None, seed: int = 0) -> None:
        self.params = params or SensorParams()
        if self.params.quantize not in ("floor", "round"):
            raise ValueError(f"SensorParams.quantize must be 'floor' or 'round', got {self.params.quantize!r}")
        self._rng = random.Random(seed)

    def read(self, plant: Plant) -> float:
        """Return one integer reading, °C."""
        value = plant.die_delayed(self.params.delay_s) + self._rng.gauss(0.0, self.params.noise_c)
        return float(math.floor(value) if self.params.quantize == "floor" else round(value))


@dataclass(frozen=True)
class Fault:
    """A sensor fault active on [start_s, end_s)."""

    # "read_error", "stuck", "garbage" or "lost".
    kind: str
    # First affected second.
    start_s: float
    # First unaffected second (inf for lost).
    end_s: float


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
    """Return the 24 h acceptance profile (notes §4), compressed to ``hours``.

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


_GARBAGE = (0.0, 127.0, 255.0, -1.0)


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
    # Governor state names.
    state: list[str]
    # Seconds of true die above the limit (at integration resolution).
    seconds_above: float
    # Highest true die, °C.
    max_die_c: float
    # Work done / work demanded.
    served: float


def _faulted(faults: Sequence[Fault], t: int, value: float, memo: dict[int, float]) -> tuple[float | None, str | None]:
    for k, f in enumerate(faults):
        if f.start_s <= t < f.end_s:
            if f.kind == "lost":
                return None, "lost"
            if f.kind == "read_error":
                return None, "read_error"
            if f.kind == "stuck":
                return memo.setdefault(k, value), None
            if f.kind == "garbage" and t % 7 == 0:
                return _GARBAGE[(t // 7) % 4], None
    return value, None


def run_profile(profile: Profile, plant: PlantParams | None = None, sensor: SensorParams | None = None,
                config: ThermalConfig | None = None, seed: int = 0, measure_power: bool = True,
                limit_c: float = 75.0) -> SimResult:
    """Close the loop: governor at 1 Hz, plant at ``dt`` = 0.25 s, the batcher's duty = min(demand, duty)."""
    sp = sensor or SensorParams()
    p = Plant(plant, profile.ambient[0], max_delay_s=sp.delay_s + 1, limit_c=limit_c)
    sens = Sensor(sp, seed)
    gov = Governor(config)
    die, readings, duties, busies, states = [], [], [], [], []
    memo: dict[int, float] = {}
    duty, busy, energy0 = 1.0, 0.0, 0.0
    done = want = 0.0
    for t, demand in enumerate(profile.demand):
        p.ambient_c, p.fan_scale = profile.ambient[t], profile.fan_scale[t]
        value, err = _faulted(profile.faults, t, sens.read(p), memo)
        power = p.energy_j - energy0 if t > 0 else None
        energy0 = p.energy_j
        duty = gov.update(float(t), value, power if measure_power else None, busy if t > 0 else None,
                          error=err)
        busy = min(demand, duty)
        die.append(p.tj)
        readings.append(value)
        duties.append(duty)
        busies.append(busy)
        states.append(gov.state.name)
        p.advance(1.0, busy)
        done += busy
        want += demand
    return SimResult(die, readings, duties, busies, states, p.seconds_above, p.max_tj, done / max(want, 1e-9))


def _open_loop(profile: Profile, plant: PlantParams | None, duty: float, track_c: float | None,
               limit_c: float, stop_above: bool) -> tuple[float, float]:
    p = Plant(plant, profile.ambient[0], limit_c=limit_c)
    done = want = 0.0
    e0 = 0.0
    for t, demand in enumerate(profile.demand):
        p.ambient_c, p.fan_scale = profile.ambient[t], profile.fan_scale[t]
        busy = min(demand, duty)
        e0 = p.energy_j
        peak = p.advance(1.0, busy, track_c)
        if stop_above and peak > limit_c:
            return peak, 0.0
        if track_c is not None:  # work done = the busy the tracker actually allowed
            dyn_full = (p.energy_j - e0) - p.params.p_idle_w
            full = p.params.p_max_w - p.params.p_idle_w
            busy = min(busy, max(dyn_full, 0.0) / (full * (1 + p.params.leak_per_c * (p.tj - 60.0))))
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


def peak_to_peak(result: SimResult, profile: Profile, window_s: int = 300, quiet_s: int = 300) -> list[float]:
    """Return the true-die peak-to-peak of each settled window, °C.

    A window is settled when, over it and the ``quiet_s`` before it, demand is full, the room and
    the fan are constant, and the governor is regulating or throttling the whole time.
    """
    out = []
    n = len(result.die)
    for start in range(quiet_s, n - window_s + 1, window_s):
        lo, hi = start - quiet_s, start + window_s
        amb, fan = profile.ambient[lo], profile.fan_scale[lo]
        if any(profile.demand[i] < 0.999 or profile.ambient[i] != amb or profile.fan_scale[i] != fan
               for i in range(lo, hi)):
            continue
        if any(result.state[i] not in ("THROTTLING", "REGULATING") for i in range(start, hi)):
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
        "blind_samples": res.state.count("BLIND"),
        "hold_samples": res.state.count("HOLDING"),
        "stopped_samples": res.state.count("STOPPED"),
        "emergency_samples": res.state.count("EMERGENCY"),
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
        checks["lost_stops"] = all(res.duty[i] == 0.0 and res.state[i] == "STOPPED" for i in after)
    elif fault in ("stuck", "stuck_load", "read_error", "garbage"):
        checks["detected"] = metrics["blind_samples"] > 0 or metrics["hold_samples"] > 0  # type: ignore[operator]
    return {"metrics": metrics, "checks": checks, "passed": all(checks.values()), "result": res}


def _plot(res: SimResult, profile: Profile, path: str, limit_c: float) -> None:
    import matplotlib  # dev-only; imported lazily

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [t / 3600.0 for t in range(len(res.die))]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(12, 6))
    ax1.plot(hours, res.die, lw=0.6, label="true die °C")
    ax1.plot(hours, profile.ambient, lw=0.6, label="room °C")
    ax1.axhline(limit_c, color="r", lw=0.8, ls="--", label=f"limit {limit_c:g} °C")
    ax1.set_ylabel("°C")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.plot(hours, res.duty, lw=0.6, label="duty")
    ax2.plot(hours, profile.demand, lw=0.4, alpha=0.5, label="demand")
    ax2.set_ylabel("fraction")
    ax2.set_xlabel("hours")
    ax2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="appliance thermal-sim",
                                 description="Run the thermal governor against the simulated GPU plant.")
    ap.add_argument("--hours", type=float, default=24.0, help="profile length; < 24 compresses the day")
    ap.add_argument("--json", metavar="FILE", help="write metrics and a 10 s trace as JSON")
    ap.add_argument("--plot", metavar="FILE.png", help="plot temperature and duty (needs matplotlib)")
    ap.add_argument("--plant", choices=sorted(PRESETS), default="5090")
    ap.add_argument("--delay-s", type=float, default=1.0, help="sensor delay, s")
    ap.add_argument("--quantize", choices=("floor", "round"), default="floor")
    ap.add_argument("--noise-c", type=float, default=0.25, help="sensor noise σ, °C")
    ap.add_argument("--seed", type=int, default=1, help="demand and noise seed")
    ap.add_argument("--fault", choices=FAULT_KINDS, default="none")
    ap.add_argument("--r-jh-scale", type=float, default=1.0, help="scale die-to-heatsink resistance")
    ap.add_argument("--heatsink-scale", type=float, default=1.0, help="scale heatsink capacity (its τ)")
    ap.add_argument("--die-scale", type=float, default=1.0, help="scale die capacity (its τ)")
    ap.add_argument("--power-limit-w", type=float, default=None, help="firmware power limit, W")
    ap.add_argument("--no-power", action="store_true", help="hide power readings (nameplate model)")
    ap.add_argument("--setpoint-c", type=float, default=None,
                    help="governor setpoint, °C (the guard moves to setpoint + 1 if needed)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``appliance thermal-sim``; return 0 when every target is met, 1 otherwise."""
    args = _parser().parse_args(argv)
    plant = PRESETS[args.plant].scaled(args.r_jh_scale, args.heatsink_scale, args.die_scale)
    if args.power_limit_w is not None:
        plant = dataclasses.replace(plant, p_limit_w=args.power_limit_w)
    sensor = SensorParams(args.delay_s, args.quantize, args.noise_c)
    config = ThermalConfig()
    if args.setpoint_c is not None:
        config = ThermalConfig(setpoint_c=args.setpoint_c, guard_c=max(config.guard_c, args.setpoint_c + 1.0))
    profile = day_profile(args.hours, seed=args.seed)
    profile.faults = fault_schedule(args.fault, len(profile.demand), args.hours / 24.0)
    out = evaluate(profile, plant, sensor, config, seed=args.seed, measure_power=not args.no_power,
                   fault=args.fault)
    res: SimResult = out.pop("result")  # type: ignore[assignment]
    metrics, checks = out["metrics"], out["checks"]
    assert isinstance(metrics, dict) and isinstance(checks, dict)
    print(f"thermal-sim: plant {plant.name}, {args.hours:g} h, delay {args.delay_s:g} s, "
          f"{args.quantize}, noise {args.noise_c:g} °C, fault {args.fault}")
    for key, value in metrics.items():
        print(f"  {key:28s} {value}")
    for key, ok in checks.items():
        print(f"  check {key:22s} {'PASS' if ok else 'FAIL'}")
    print("PASS" if out["passed"] else "FAIL")
    if args.json:
        doc = {
            "args": vars(args), "plant": dataclasses.asdict(plant), "sensor": dataclasses.asdict(sensor),
            "config": dataclasses.asdict(config), **out,
            "trace_10s": {
                "t_s": list(range(0, len(res.die), 10)),
                "die_c": [round(x, 2) for x in res.die[::10]],
                "duty": [round(x, 3) for x in res.duty[::10]],
                "demand": [round(x, 3) for x in profile.demand[::10]],
                "ambient_c": [round(x, 2) for x in profile.ambient[::10]],
                "state": res.state[::10],
            },
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    if args.plot:
        _plot(res, profile, args.plot, config.limit_c)
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
