"""The governor's vocabulary: its states, its settings and what it reports after each update.

:class:`GovernorState`, :class:`ThermalConfig` (validated on construction) and :class:`Decision`; the
controller itself is :mod:`appliance.thermal.governor`, which re-exports all three.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

__all__ = ["Decision", "GovernorState", "ThermalConfig"]


class GovernorState(enum.IntEnum):
    """Where the governor stands, ordered by severity.

    Ordering rule: ``state >= THROTTLING`` limits throughput (degraded); ``state >= EMERGENCY``
    stops dispatch (NOT_SERVING). ``DISABLED`` is only reported by controllers without a sensor.
    """

    DISABLED = 0  # no thermometer: the governor is not running, duty 1
    COOL = 1  # reading below switch-on: duty 1, integrator frozen
    REGULATING = 2  # PI active but not limiting (duty 1)
    THROTTLING = 3  # PI active and limiting (duty < 1)
    HOLDING = 4  # sensor error: last duty held for at most hold_s
    BLIND = 5  # sensor untrusted: commissioned blind duty
    EMERGENCY = 6  # reading far above the limit at minimum duty: duty 0 until cooled
    STOPPED = 7  # GPU lost: duty 0 for good (terminal; restart the service)


@dataclass(frozen=True)
class ThermalConfig:
    """Governor settings. Defaults suit a 5090-class card with a 1 s NVML period (docs/thermal.md).

    Every field is validated in ``__post_init__``; errors name the field.
    """

    # Hard wall on the NVML GPU sensor, °C. Reported seconds-above are counted against it.
    limit_c: float = 75.0
    # PI target, °C. 3 °C margin covers 1–3 s sensor delay, flooring and noise (docs/thermal.md).
    setpoint_c: float = 72.0
    # Below this reading the governor idles at duty 1 with the integrator frozen, °C.
    switch_on_c: float = 60.0
    # Second line of defence: at a reading >= guard_c the budget is capped at guard_factor × power.
    guard_c: float = 74.0
    # Fraction of measured power the budget may keep while the guard is active.
    guard_factor: float = 0.93
    # Proportional gain below the setpoint (approach gently), W/°C. 20 rather than 30: with a
    # 3 s delay, rounding and σ 0.5 °C noise, 30/60 oscillated 1.8 °C peak-to-peak; 20/40 gives 1.2 (0.67 on
    # the nominal plant) at the same served fraction (thermal-sim, 24 h).
    kp_cool_w_per_c: float = 20.0
    # Proportional gain above the setpoint (back off fast), W/°C.
    kp_hot_w_per_c: float = 40.0
    # Integral time, s (≈ heatsink time constant / 1.5). Integral gain = kp_cool / ti_s.
    ti_s: float = 30.0
    # Slack on the anti-windup test: integrate upward only while busy >= duty - busy_slack.
    busy_slack: float = 0.05
    # Lowest duty in normal operation; pausing completely is the fail-safe's job.
    min_duty: float = 0.05
    # Commissioned constant duty proven safe in the worst-case room with fan margin (docs/thermal.md).
    blind_duty: float = 0.5
    # Seconds the last duty is held after a sensor error before going blind.
    hold_s: float = 3.0
    # Consecutive good samples needed to leave BLIND.
    recover_samples: int = 5
    # A BLIND caused only by failed reads (no stuck verdict, no implausible value) whose outage began at most this
    # long ago needs 2 good samples, not recover_samples: a flaky bus (20 % failed reads) otherwise spends ~10 s
    # at the blind duty per 3-read gap. The recovery ramp still applies. 0 always asks for recover_samples.
    short_outage_s: float = 30.0
    # After BLIND the duty may rise from blind_duty by at most this much per second.
    recover_ramp_per_s: float = 0.05
    # Nameplate idle power, W: used until/unless measured power teaches the model.
    p_idle_w: float = 30.0
    # Nameplate power at duty 1, W.
    p_max_w: float = 575.0
    # Plausible readings lie in [plausible_min_c, plausible_max_c], °C.
    plausible_min_c: float = 5.0
    # Upper end of the plausible range, °C.
    plausible_max_c: float = 110.0
    # A reading that moves more than this × period_s from the last good one is implausible, °C/s.
    max_jump_c_per_s: float = 10.0
    # A believed reading is taken at most fall_margin_c below the envelope of the recent readings, which follows the
    # die and heatsink models and sinks at fall_rate_c_per_s beyond them (docs/thermal.md, point 9): a glitch stream
    # 8-12 °C low, or a reading that froze low by an ordinary step, no longer reads as a cool die. A real cooling
    # that the models do not explain (a fan speeding up) is followed at fall_rate_c_per_s.
    fall_margin_c: float = 2.0
    fall_rate_c_per_s: float = 0.1
    # The margin for a while after a reading was rejected as a glitch (a jump, or outvoted), °C (fall_margin_c if
    # that is smaller): a sensor caught lying gets less benefit of the doubt (half the reads 6 °C low, session 16).
    fall_doubt_margin_c: float = 0.5
    # Frozen-sensor detector (appliance/thermal/sensorcheck.py, docs/thermal.md). Die rise over the heatsink
    # at p_max_w (P_max · R_jh), °C; commissioning measures it. 10 is the low end of the rated range: a smaller
    # value than the real one only slows detection, a larger one risks false positives.
    die_rise_c: float = 10.0
    # Die time constant R_jh · C_j, s (commissioning: step response). Longer is the cautious side.
    die_tau_s: float = 6.0
    # Longest sensor delay (dead time) to allow for, s (commissioning: step response).
    sensor_delay_s: float = 3.0
    # Heatsink rise over the room at full power (P_max · R_ha), °C, and its time constant, s (commissioning:
    # blind-duty hold and cool-down). With it, a reading that stalls while the power-driven model says the die
    # keeps warming is regulated as reading + that rise beyond one step (sensorcheck); 0 disables this.
    # Uncommissioned: 25, the low end of the rated range (full-load rise 40-56 °C over the room, of which
    # 10-18 °C is the die over the heatsink). With 0, a reading frozen while the die warms took an
    # uncommissioned governor to 75.6 °C on 10 of 320 matrix plants; with 25, none passed 74.4 °C.
    sink_rise_c: float = 25.0
    # Heatsink time constant with the fan on, s.
    sink_tau_s: float = 60.0
    # The model-expected change a live reading must show, °C.
    stuck_expect_c: float = 1.2
    # The model-expected fall a live reading must show during a probe, °C.
    probe_expect_c: float = 2.0
    # An unchanged reading at most this long while regulating starts a duty probe, s (a noisy sensor's own
    # history shortens it, see sensorcheck).
    probe_after_s: float = 240.0
    # Probe ramp: fraction of the busy fraction removed per second, until the reading moves.
    probe_rate: float = 0.01
    # Largest probe cut, fraction of the busy fraction.
    probe_max_cut: float = 0.4
    # While a reading is judged stuck (BLIND at the blind duty), the duty dips by probe_max_cut for stuck_dip_s
    # every stuck_dip_every_s, so a live sensor that reads its frozen value again (a quiet die settled at the
    # blind duty) shows a change and BLIND ends; lower duty is the safe direction. 0 turns the dips off.
    stuck_dip_every_s: float = 120.0
    # Length of each dip, s.
    stuck_dip_s: float = 20.0
    # No budget increase while the reading has been unchanged for longer than this, s.
    frozen_hold_s: float = 20.0
    # Delay compensation: the reading the PI regulates on is the reading plus this fraction of the change a
    # power-driven die model (die_rise_c, die_tau_s) made over the last sensor_delay_s, i.e. what the die did
    # that the sensor cannot show yet (a Smith-predictor-like lead). 0 turns it off.
    lead_gain: float = 0.7
    # Noise filter on the proportional path, s: the P term acts on the reading passed through a first-order
    # filter of this time constant that follows the die model between readings (it adds the model's own change,
    # delayed by sensor_delay_s, before blending the new reading in), so a power step reaches it at once and only
    # sensor noise and quantisation flips are smoothed. The integrator, the guard and the boost's guard-hit count
    # keep the raw reading: the filter removes the P term's noise kicks (settled peak-to-peak) and nothing else.
    # 0 turns it off (docs/thermal.md).
    reading_filter_s: float = 2.0
    # Live boost, °C: the PI target may rise by up to this much above setpoint_c, at boost_rate_c_per_s, only
    # while the reading is demonstrably live (it moved within what its own history makes plausible, no duty
    # probe) and settled (its 10 s mean within -1/+0.25 °C of the target). It is withdrawn at once on an unseen
    # model rise (a stalled reading while the die warms), a read error past hold_s, BLIND or stuck; its ceiling
    # shrinks linearly to 0 as the share of readings at or above guard_c (5 min mean) nears boost_hit_rate (a
    # noisy or flooring sensor whose upper tail nears the wall keeps less of it), and it decays at 5x its rate
    # when the 10 s mean runs 0.75 °C over the target. The guard and every fault path stay at the commissioned
    # values. 0 turns it off (docs/thermal.md).
    live_boost_c: float = 0.5
    # How fast the live boost comes back, °C/s.
    boost_rate_c_per_s: float = 0.01
    # Share of readings at or above guard_c (5 min mean) at which the boost is gone; it shrinks linearly to it.
    boost_hit_rate: float = 0.1
    # Emergency: a reading >= emergency_c for emergency_s with duty at minimum pauses dispatch.
    emergency_c: float = 77.0
    # Seconds above emergency_c (at minimum duty) before EMERGENCY.
    emergency_s: float = 10.0
    # Nominal control period, s; longer gaps are clamped to 3 periods in the integrator.
    period_s: float = 1.0

    def __post_init__(self) -> None:
        positive = (
            "limit_c", "kp_cool_w_per_c", "kp_hot_w_per_c", "ti_s", "blind_duty", "hold_s",
            "p_max_w", "max_jump_c_per_s", "die_rise_c", "die_tau_s", "stuck_expect_c", "probe_expect_c",
            "probe_after_s", "probe_rate", "frozen_hold_s", "emergency_s", "period_s", "plausible_max_c", "sink_tau_s",
            "boost_rate_c_per_s", "boost_hit_rate", "recover_ramp_per_s", "fall_margin_c", "fall_rate_c_per_s",
        )
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ThermalConfig.{name} must be a positive finite number, got {value!r}")
        for name in ("min_duty", "blind_duty", "busy_slack", "probe_max_cut", "lead_gain"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ThermalConfig.{name} must lie in [0, 1], got {value!r}")
        if not 0.0 < self.guard_factor <= 1.0:
            raise ValueError(f"ThermalConfig.guard_factor must lie in (0, 1], got {self.guard_factor!r}")
        if self.min_duty > self.blind_duty:
            raise ValueError("ThermalConfig.blind_duty must be >= min_duty")
        if not self.switch_on_c < self.setpoint_c < self.limit_c:
            raise ValueError(
                "ThermalConfig.setpoint_c must lie between switch_on_c and limit_c, got "
                f"{self.switch_on_c} < {self.setpoint_c} < {self.limit_c}"
            )
        if not self.setpoint_c < self.guard_c <= self.emergency_c:
            raise ValueError("ThermalConfig.guard_c must lie in (setpoint_c, emergency_c]")
        if not 0.0 <= self.p_idle_w < self.p_max_w:
            raise ValueError("ThermalConfig.p_idle_w must lie in [0, p_max_w)")
        if not self.plausible_min_c < self.switch_on_c:
            raise ValueError("ThermalConfig.plausible_min_c must be below switch_on_c")
        for name in ("sensor_delay_s", "sink_rise_c", "reading_filter_s", "short_outage_s", "stuck_dip_every_s",
                     "stuck_dip_s", "fall_doubt_margin_c"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"ThermalConfig.{name} must be >= 0, got {value!r}")
        if self.recover_samples < 1:
            raise ValueError("ThermalConfig.recover_samples must be >= 1")

    @property
    def nameplate_w(self) -> float:
        """Watts of a full duty above idle on the nameplate (``p_max_w - p_idle_w``)."""
        return self.p_max_w - self.p_idle_w

    def replace(self, **changes: float) -> ThermalConfig:
        """Return a validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Decision:
    """What the governor decided on its last update (read-only; for status and metrics)."""

    # Time of the sample, monotonic s.
    now_s: float
    # Pacing duty in [0, 1] for the next period.
    duty: float
    # Power budget of the PI law, W (None outside regulation).
    budget_w: float | None
    # Governor state after the update.
    state: GovernorState
    # Short human reason, e.g. "pi", "guard", "read_error hold", "stuck: power moved".
    reason: str
    # (limit − reading) / (limit − switch_on), clipped to [0, 1]; None without a good reading.
    headroom: float | None
    # The temperature regulated on, °C: the reading, plus in regulation the lead and unseen-rise terms (None if the
    # reading was rejected or missing).
    temp_c: float | None
    # Power used by the model, W (measured, from energy, or estimated).
    power_w: float | None
    # The sensor's reading itself, °C, when it was used (status and metrics show this one).
    reading_c: float | None = None
