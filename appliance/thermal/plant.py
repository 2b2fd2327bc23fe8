"""The simulated GPU: a two-node thermal plant with a stock fan, an NVML-like sensor, and plant ranges.

The plant (``docs/thermal.md``) is two RC nodes and a stock fan::

    C_j·dT_j/dt = P − (T_j − T_h)/R_jh                       die + vapour chamber (the sensor)
    C_h·dT_h/dt = (T_j − T_h)/R_jh − (g0 + g1·fan)·(T_h − T_amb)
    P = P_idle + u·min(P_dyn·(1 + leak·(T_j − 60)), P_limit − P_idle)
    fan: off below 45 / on above 55 °C (hysteresis), 30 → 100 % from 55 → 85 °C, τ_fan 4 s

integrated with Euler steps of ``dt_s`` (0.25 s) and read by a sensor with delay, noise and integer
quantisation (floor or round). :func:`random_plant` and :func:`random_sensor` draw plants nobody tuned
the governor on, within the documented :data:`PLANT_RANGES` / :data:`SENSOR_RANGES`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from dataclasses import dataclass

__all__ = [
    "PLANT_RANGES",
    "PRESETS",
    "SENSOR_RANGES",
    "SENSOR_FAULTS",
    "Fault",
    "FaultInjector",
    "Plant",
    "PlantParams",
    "Sensor",
    "SensorParams",
    "blind_duty_for",
    "random_plant",
    "random_sensor",
    "steady_die_c",
]

@dataclass(frozen=True)
class PlantParams:
    """Physical parameters of the simulated card (docs/thermal.md; values are assumptions)."""

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
        self.busy_s = 0.0  # busy seconds actually run (with ``track_c``, after the tracker's cap)
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
            self.busy_s += u * h
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


SENSOR_FAULTS = ("read_error", "flaky", "stuck", "garbage", "lost")
"""Sensor fault kinds a :class:`Fault` may have."""

_GARBAGE = (0.0, 127.0, 255.0, -1.0)


@dataclass(frozen=True)
class Fault:
    """A sensor fault active on [start_s, end_s).

    Kinds: ``read_error`` (every read fails), ``flaky`` (each read fails with probability ``rate``),
    ``stuck`` (the reading freezes at its value at onset, or at ``value`` when given), ``garbage`` (every
    7th read returns 0, 127, 255 or −1), ``lost`` (the GPU fell off the bus).
    """

    # One of SENSOR_FAULTS.
    kind: str
    # First affected second.
    start_s: float
    # First unaffected second (inf for lost).
    end_s: float
    # For "stuck": the frozen reading, °C (None = the reading at onset).
    value: float | None = None
    # For "flaky": probability that one read fails.
    rate: float = 0.2

    def __post_init__(self) -> None:
        if self.kind not in SENSOR_FAULTS:
            raise ValueError(f"Fault.kind must be one of {', '.join(SENSOR_FAULTS)}, got {self.kind!r}")


class FaultInjector:
    """Applies :class:`Fault` windows to a stream of readings (one call per read, in time order)."""

    def __init__(self, faults: list[Fault] | tuple[Fault, ...] = (), seed: int = 0) -> None:
        self.faults = list(faults)
        self._frozen: dict[int, float] = {}
        self._rng = random.Random(seed ^ 0x5EED)

    def apply(self, t: float, value: float) -> tuple[float | None, str | None]:
        """Return (reading, error kind) at time ``t`` for a healthy reading ``value``."""
        for k, f in enumerate(self.faults):
            if not f.start_s <= t < f.end_s:
                continue
            if f.kind in ("lost", "read_error"):
                return None, f.kind
            if f.kind == "flaky":
                if self._rng.random() < f.rate:
                    return None, "read_error"
            elif f.kind == "stuck":
                return self._frozen.setdefault(k, value if f.value is None else f.value), None
            elif f.kind == "garbage" and int(t) % 7 == 0:
                return _GARBAGE[(int(t) // 7) % 4], None
        return value, None


def steady_die_c(params: PlantParams, duty: float, ambient_c: float, fan_scale: float = 1.0) -> float:
    """Return the steady-state die temperature at a constant duty, °C (fixed point of the plant)."""
    p = params
    p_dyn = p.p_max_w - p.p_idle_w
    p_room = (p.p_limit_w or p.p_max_w) - p.p_idle_w
    tj = ambient_c + 20.0
    for _ in range(200):
        power = p.p_idle_w + duty * min(p_dyn * (1.0 + p.leak_per_c * (tj - 60.0)), p_room)
        on = tj >= p.fan_off_c
        fan = (p.fan_min + (1.0 - p.fan_min) * min(max((tj - p.fan_on_c) / (p.fan_full_c - p.fan_on_c), 0.0),
                                                     1.0)) * fan_scale if on else 0.0
        new = ambient_c + power / (p.g0 + p.g1 * fan) + power * p.r_jh
        if abs(new - tj) < 1e-6:
            break
        tj = 0.5 * (tj + new)
    return tj


def blind_duty_for(params: PlantParams, worst_room_c: float = 40.0, fan_scale: float = 0.8,
                   ceiling_c: float = 72.0) -> float:
    """The commissioned blind duty.

    the largest duty (a multiple of 0.05, at least 0.05) whose steady die stays <= ``ceiling_c`` in ``worst_room_c``
    with the fan at ``fan_scale`` of its curve.
    """
    u = 1.0
    while u > 0.05 + 1e-9 and steady_die_c(params, u, worst_room_c, fan_scale) > ceiling_c:
        u = round(u - 0.05, 2)
    return max(u, 0.05)


PLANT_RANGES: dict[str, tuple[float, float]] = {
    "p_max_w": (250.0, 650.0),  # board power at duty 1
    "idle_frac": (0.04, 0.08),  # P_idle / P_max
    "die_rise_c": (10.0, 18.0),  # P_max · R_jh: die over heatsink at full power (13–14 for 4090/5090)
    "tau_die_s": (2.5, 9.0),  # R_jh · C_j
    "full_load_rise_c": (40.0, 56.0),  # steady die over a 25 °C room at duty 1 (5090-like: 51)
    "tau_heatsink_s": (25.0, 120.0),  # C_h / G with the fan on
    "g0_frac": (0.1, 0.2),  # fan-off share of the heatsink conductance
    "leak_per_c": (0.001, 0.003),
    "tau_fan_s": (2.0, 8.0),
}
"""Ranges (uniform) of the randomised plants; documented in ``docs/thermal.md``."""

SENSOR_RANGES: dict[str, tuple[float, float]] = {
    "delay_s": (0.5, 3.0),
    "noise_c": (0.0, 0.5),
}
"""Ranges (uniform) of the randomised sensors; quantisation is floor or round with equal odds."""


def random_plant(rng: random.Random, name: str = "random") -> PlantParams:
    """Draw a plant uniformly within :data:`PLANT_RANGES`."""
    def u(key: str) -> float:
        lo, hi = PLANT_RANGES[key]
        return rng.uniform(lo, hi)

    p_max = u("p_max_w")
    p_idle = u("idle_frac") * p_max
    r_jh = u("die_rise_c") / p_max
    c_j = u("tau_die_s") / r_jh
    rise = u("full_load_rise_c")
    t_ss = 25.0 + rise
    fan = PlantParams.fan_min + (1.0 - PlantParams.fan_min) * min(max((t_ss - 55.0) / 30.0, 0.0), 1.0)
    r_ha = max(rise / p_max - r_jh, 0.02)
    g_total = 1.0 / r_ha  # at the fan speed of the full-load steady state
    g0 = u("g0_frac") * g_total
    g1 = (g_total - g0) / fan
    c_h = u("tau_heatsink_s") * (g0 + g1 * 0.7)
    return PlantParams(name, round(p_idle, 1), round(p_max, 1), None, r_jh, c_j, c_h, g0, g1,
                       u("leak_per_c"), tau_fan_s=u("tau_fan_s"))


def random_sensor(rng: random.Random) -> SensorParams:
    """Draw a sensor within :data:`SENSOR_RANGES` (floor or round)."""
    lo, hi = SENSOR_RANGES["delay_s"]
    delay = rng.uniform(lo, hi)
    lo, hi = SENSOR_RANGES["noise_c"]
    return SensorParams(round(delay, 2), rng.choice(("floor", "round")), round(rng.uniform(lo, hi), 2))


