"""The fault matrix: every sensor fault on plants nobody tuned the governor on (``docs/thermal.md``).

Each *plant* is drawn within :data:`~appliance.thermal.plant.PLANT_RANGES` and gets a random sensor
(delay, floor or round, noise) from a seed; two named plants that failed before are always included. Each
plant gets its own room (warm enough that full load would run its die to about 82 °C), its own commissioned
blind duty and its own nameplate power. The profile (:func:`matrix_profile`) runs full load while the room
drifts up and down at 4 °C/h, bursts, an idle period and a load step after it, and a degraded fan. Each
*fault* (:data:`FAULTS`) is placed on that profile; every (plant, fault) pair is one cell.

Per cell: seconds of true die above 75 °C, served fraction and its ratio to the ideal tracker, die
peak-to-peak in settled windows, detection time of the fault, and false BLIND episodes (outside any fault).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from appliance.thermal.commissioning import setpoint_for_delay
from appliance.thermal.governor import GovernorState, ThermalConfig
from appliance.thermal.plant import (
    PRESETS,
    Fault,
    PlantParams,
    SensorParams,
    blind_duty_for,
    random_plant,
    random_sensor,
    steady_die_c,
)
from appliance.thermal.sim import Profile, SimResult, ideal_tracker, peak_to_peak, run_profile

__all__ = ["EXTRA_FAULTS", "FAULTS", "Cell", "MatrixPlant", "fault_windows", "matrix_plants", "matrix_profile",
           "run_cell", "run_matrix", "summarize"]

FAULTS = ("none", "read_error", "flaky", "stuck_onset", "stuck_warming", "stuck_plausible", "garbage", "lost")
"""Fault columns of the matrix."""

EXTRA_FAULTS: tuple[str, ...] = ()
"""Columns run only on request (``--faults``)."""

_DETECTED = (GovernorState.HOLDING, GovernorState.BLIND, GovernorState.STOPPED)


@dataclass(frozen=True)
class MatrixPlant:
    """One row: a plant, its sensor, its room and what commissioning would have stored for it."""

    plant: PlantParams
    sensor: SensorParams
    # Room temperature at the start of the profile, °C.
    room_c: float
    # Commissioned blind duty (safe at room + 9 °C with the fan at 80 %).
    blind_duty: float

    def config(self, base: ThermalConfig | None = None) -> ThermalConfig:
        """The governor settings for this plant: ``base`` with the plant's nameplate power and blind duty."""
        base = base or ThermalConfig()
        p = self.plant
        delay = math.ceil(self.sensor.delay_s * 2 + 1) / 2  # a dead-time fit on a 0.5 s grid, + 0.5 s
        setpoint = setpoint_for_delay(delay, base.limit_c)
        return base.replace(p_idle_w=p.p_idle_w, p_max_w=p.p_max_w, blind_duty=self.blind_duty,
                            die_rise_c=self.die_rise_c, die_tau_s=self.die_tau_s, sensor_delay_s=delay,
                            sink_rise_c=self.sink_rise_c, sink_tau_s=self.sink_tau_s,
                            setpoint_c=setpoint, guard_c=max(base.guard_c, setpoint + 1.0))

    @property
    def die_rise_c(self) -> float:
        """What commissioning stores for P_max · R_jh: 80 % of the true value (a cautious fit)."""
        return round(0.8 * self.plant.r_jh * (self.plant.p_max_w - self.plant.p_idle_w), 2)

    @property
    def sink_rise_c(self) -> float:
        """What commissioning stores for P_max · R_ha (heatsink to room, fan at 70 %): 80 % of the true value."""
        p = self.plant
        return round(0.8 * (p.p_max_w - p.p_idle_w) / (p.g0 + 0.7 * p.g1), 2)

    @property
    def sink_tau_s(self) -> float:
        """What commissioning stores for the heatsink time constant (fan at 70 %), s."""
        p = self.plant
        return round(p.c_h / (p.g0 + 0.7 * p.g1), 1)

    @property
    def die_tau_s(self) -> float:
        """What commissioning stores for τ_die: the true value rounded up to 0.5 s."""
        return math.ceil(self.plant.r_jh * self.plant.c_j * 2) / 2

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters, with derived time constants."""
        p = self.plant
        return {
            "name": p.name, "p_max_w": p.p_max_w, "p_idle_w": p.p_idle_w, "r_jh": round(p.r_jh, 5),
            "tau_die_s": round(p.r_jh * p.c_j, 2), "c_h": round(p.c_h, 1), "g0": round(p.g0, 3),
            "g1": round(p.g1, 3), "delay_s": self.sensor.delay_s, "quantize": self.sensor.quantize,
            "noise_c": self.sensor.noise_c, "room_c": round(self.room_c, 2), "blind_duty": self.blind_duty,
            "full_load_die_at_room_c": round(steady_die_c(p, 1.0, self.room_c), 2),
        }


def _row(plant: PlantParams, sensor: SensorParams, target_c: float = 82.0) -> MatrixPlant:
    room = 25.0 + (target_c - steady_die_c(plant, 1.0, 25.0))
    room = min(max(room, 15.0), 40.0)
    return MatrixPlant(plant, sensor, room, blind_duty_for(plant, room + 9.0, 0.8, 72.0))


def matrix_plants(n_random: int, seed: int = 7) -> list[MatrixPlant]:
    """The two named plants that failed before, then ``n_random`` random ones (reproducible by seed)."""
    p5090 = PRESETS["5090"]
    heavy = dataclasses.replace(p5090, name="heavy600", p_max_w=600.0, c_h=p5090.c_h * 2.5)
    compact = dataclasses.replace(PRESETS["4090"], name="compact420", p_max_w=420.0, c_h=600.0, c_j=120.0)
    rows = [_row(heavy, SensorParams(2.5, "floor", 0.25)), _row(compact, SensorParams(3.0, "floor", 0.25))]
    rng = random.Random(seed)
    for i in range(n_random):
        rows.append(_row(random_plant(rng, f"rand{seed}-{i}"), random_sensor(rng)))
    return rows


def matrix_profile(room_c: float, hours: float = 3.0, seed: int = 1) -> Profile:
    """Full load with the room drifting at ±4 °C/h, bursts, idle and a load step, a degraded fan.

    Phases as fractions of ``hours`` (3 h by default): 0–3 % idle; full load to 50 % with the room flat
    until 11 %, then rising 4 °C/h; bursts to 67 % with the room falling 4 °C/h; idle to 72 %; full load to
    the end, the fan at 70 % from 83 %.
    """
    n = int(hours * 3600)
    rng = random.Random(seed)
    demand, ambient, fan = [1.0] * n, [room_c] * n, [1.0] * n
    drift = 4.0 / 3600.0

    def at(frac: float) -> int:
        return min(int(frac * n), n)

    for i in range(0, at(0.03)):
        demand[i] = 0.0
    peak = room_c
    for i in range(at(0.11), at(0.50)):
        ambient[i] = peak = room_c + drift * (i - at(0.11))
    i = at(0.50)
    on = True
    while i < at(0.67):
        length = rng.randint(60, 600)
        level = 1.0 if on else rng.uniform(0.0, 0.3)
        for j in range(i, min(i + length, at(0.67))):
            demand[j] = level
        i += length
        on = not on
    for i in range(at(0.50), n):
        ambient[i] = max(room_c, peak - drift * (i - at(0.50))) if i < at(0.67) else ambient[i - 1]
    for i in range(at(0.67), at(0.72)):
        demand[i] = 0.02
    for i in range(at(0.83), n):
        fan[i] = 0.7
    return Profile(demand, ambient, fan)


def fault_windows(fault: str, n: int) -> list[Fault]:
    """The fault windows of ``fault`` on a matrix profile of ``n`` seconds."""
    def at(frac: float) -> float:
        return float(int(frac * n))

    if fault == "none":
        return []
    if fault == "read_error":
        return [Fault("read_error", at(0.15), at(0.15) + 10), Fault("read_error", at(0.25), at(0.25) + 300),
                Fault("read_error", at(0.70), at(0.78))]
    if fault == "flaky":
        return [Fault("flaky", at(0.11), at(0.50), rate=0.2), Fault("flaky", at(0.72), float(n), rate=0.2)]
    if fault == "stuck_onset":  # frozen while idle and cool, across the idle -> full load step
        return [Fault("stuck", at(0.69), at(0.80))]
    if fault == "stuck_warming":  # frozen 45 s into the load step, while the die is still warming up
        return [Fault("stuck", at(0.72) + 45, at(0.80))]
    if fault == "stuck_plausible":  # frozen at steady load, near the setpoint, while the room warms
        return [Fault("stuck", at(0.22), at(0.50))]
    if fault == "garbage":
        return [Fault("garbage", at(0.11), at(0.50))]
    if fault == "lost":
        return [Fault("lost", at(0.30), math.inf)]
    raise ValueError(f"fault must be one of {', '.join(FAULTS + EXTRA_FAULTS)}, got {fault!r}")


@dataclass
class Cell:
    """One (plant, fault) result."""

    plant: str
    fault: str
    seconds_above: float
    max_die_c: float
    served: float
    ratio_ideal: float
    peak_to_peak_c: float | None
    detection_s: float | None
    false_blind_episodes: int
    false_blind_s: int
    blind_s: int
    passed: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return dataclasses.asdict(self)


def _detection(res: SimResult, faults: Sequence[Fault], fault: str) -> float | None:
    if not faults:
        return None
    start = int(faults[0].start_s)
    if fault == "stuck_onset":  # the reading stays plausible until the load step makes it wrong
        start = max(start, next((i for i in range(start, len(res.busy)) if res.busy[i] > 0.5), start))
    for i in range(start, int(min(faults[0].end_s + 1, len(res.state)))):
        if res.state[i] in _DETECTED:
            return float(i - start)
    return None


def _false_blind(res: SimResult, faults: Sequence[Fault], grace_s: int = 30) -> tuple[int, int]:
    episodes = seconds = 0
    prev = False
    for i, state in enumerate(res.state):
        blind = state is GovernorState.BLIND and not any(
            f.start_s <= i < f.end_s + grace_s for f in faults)
        if blind:
            seconds += 1
            if not prev:
                episodes += 1
        prev = blind
    return episodes, seconds


def run_cell(row: MatrixPlant, fault: str, hours: float = 3.0, seed: int = 1, ideal: float | None = None,
             base: ThermalConfig | None = None) -> Cell:
    """Run one cell and score it.

    0 s above the limit always; with a healthy (or flaky) sensor also served >= 0.90 of the ideal tracker, peak-to-peak
    <= 1.5 °C settled and no BLIND at all.
    """
    profile = matrix_profile(row.room_c, hours, seed)
    profile.faults = fault_windows(fault, len(profile.demand))
    cfg = row.config(base)
    res = run_profile(profile, row.plant, row.sensor, cfg, seed=seed, limit_c=cfg.limit_c)
    if ideal is None:
        ideal = ideal_tracker(profile, row.plant, cfg.limit_c)
    pp = peak_to_peak(res, profile, ambient_tol_c=0.5)
    ratio = res.served / max(ideal, 1e-9)
    false_eps, false_s = _false_blind(res, profile.faults)
    why = []
    if res.seconds_above > 0:
        why.append(f"{res.seconds_above:.1f} s above {cfg.limit_c:g} °C")
    if fault in ("none", "flaky"):
        if ratio < 0.90:
            why.append(f"served {ratio:.3f} of ideal < 0.90")
        if pp and max(pp) > 1.5:
            why.append(f"peak-to-peak {max(pp):.2f} °C > 1.5")
    if fault == "lost" and any(
            res.duty[i] != 0.0 for i in range(int(profile.faults[0].start_s), len(res.duty))):
        why.append("dispatch not stopped after the GPU was lost")
    det = _detection(res, profile.faults, fault)
    if fault not in ("none", "flaky") and det is None:
        why.append("fault never detected")
    return Cell(row.plant.name, fault, round(res.seconds_above, 2), round(res.max_die_c, 3), round(res.served, 4),
                round(ratio, 4), round(max(pp), 3) if pp else None, det, false_eps, false_s,
                res.state.count(GovernorState.BLIND), not why, "; ".join(why))


def run_matrix(rows: Sequence[MatrixPlant], faults: Sequence[str] = FAULTS, hours: float = 3.0, seed: int = 1,
               base: ThermalConfig | None = None) -> list[Cell]:
    """Run every (plant, fault) cell; the ideal tracker is computed once per plant."""
    cells = []
    for row in rows:
        profile = matrix_profile(row.room_c, hours, seed)
        ideal = ideal_tracker(profile, row.plant, (base or ThermalConfig()).limit_c)
        for fault in faults:
            cells.append(run_cell(row, fault, hours, seed, ideal, base))
    return cells


def summarize(cells: Sequence[Cell]) -> dict[str, Any]:
    """Totals over the matrix: cells passed, worst figures, false positives."""
    healthy = [c for c in cells if c.fault in ("none", "flaky")]
    faults = [f for f in FAULTS + EXTRA_FAULTS if f != "none" and any(c.fault == f for c in cells)]
    dets = {f: [c.detection_s for c in cells if c.fault == f and c.detection_s is not None] for f in faults}
    pps = [c.peak_to_peak_c for c in healthy if c.peak_to_peak_c is not None]
    return {
        "cells": len(cells), "passed": sum(c.passed for c in cells),
        "max_seconds_above": max((c.seconds_above for c in cells), default=0.0),
        "max_die_c": max((c.max_die_c for c in cells), default=0.0),
        "min_ratio_ideal_healthy": min((c.ratio_ideal for c in healthy), default=None),
        "max_peak_to_peak_c": max(pps) if pps else None,
        "max_detection_s": {f: max(v) if v else None for f, v in dets.items()},
        "false_blind_episodes": sum(c.false_blind_episodes for c in cells),
        "false_blind_s": sum(c.false_blind_s for c in cells),
    }
