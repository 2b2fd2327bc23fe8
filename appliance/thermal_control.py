"""The small loop that feeds the governor from a thermometer, and the status it exposes.

The batcher owns pacing; it sets :attr:`ThermalController.busy_source` (the fraction of the last
period the engine computed) and reads :attr:`ThermalController.duty`. Something calls :meth:`tick`
about once per second (:meth:`run` does, on a clock). Status, metrics and health read
:meth:`snapshot`, :attr:`serving` and :attr:`degraded`; all three are thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from appliance.governor import Governor, GovernorState, ThermalConfig
from appliance.thermometers import MonotonicClock, SimulatedThermometer, Thermometer

__all__ = ["ThermalController", "ThermalStatus"]

log = logging.getLogger(__name__)

_DEGRADED = frozenset({GovernorState.THROTTLING, GovernorState.HOLDING, GovernorState.BLIND,
                       GovernorState.EMERGENCY})


@dataclass(frozen=True)
class ThermalStatus:
    """A snapshot for the status RPC, metrics and ``appliance health``."""

    # False when there is no thermometer (CPU-only box, or --thermal none).
    enabled: bool
    # Last good reading, °C (None if none yet or disabled).
    temperature_c: float | None
    # Current pacing duty in [0, 1].
    duty: float
    # Governor state name: DISABLED, COOL, REGULATING, THROTTLING, HOLDING, BLIND, EMERGENCY, STOPPED.
    state: str
    # Seconds with a reading >= the limit since start (a reading of 75 under flooring means >= 75.0 °C).
    seconds_above_limit: float
    # Samples rejected so far (failed reads, implausible values, stuck sensor).
    sensor_errors: int
    # Last power figure the governor used, W.
    power_w: float | None
    # Why: the governor's reason, or why the thermometer is unavailable.
    reason: str
    # PI power budget, W (None outside regulation).
    budget_w: float | None = None
    # (limit − T) / (limit − switch-on) in [0, 1]; None without a reading.
    headroom: float | None = None
    # Governor setpoint, °C.
    setpoint_c: float = 75.0
    # Hard limit, °C.
    limit_c: float = 75.0
    # Seconds spent with duty < 1 since start.
    throttled_seconds: float = 0.0
    # Failed reads by error kind.
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    # Thermometer name: nvml, sim, none.
    source: str = "none"


class ThermalController:
    """Reads the thermometer, drives the governor, and records what happened.

    Args:
        thermometer: The sample source; unavailable → governor disabled (duty 1, state DISABLED),
            unless ``require_sensor`` (a GPU engine is in use), then BLIND at the blind duty.
        governor: The governor (default: ``Governor(ThermalConfig())``).
        clock: Any object with ``monotonic()`` (and ``sleep()`` for :meth:`run`).
        busy_source: Returns the fraction of the last period the engine computed.
        require_sensor: Treat a missing sensor as blind rather than disabled.
    """

    def __init__(self, thermometer: Thermometer, governor: Governor | None = None,
                 clock: MonotonicClock | None = None, busy_source: Callable[[], float] | None = None,
                 require_sensor: bool = False) -> None:
        if clock is None:
            from appliance.clock import RealClock

            clock = RealClock()
        self.thermometer = thermometer
        self.governor = governor or Governor(ThermalConfig())
        self.clock = clock
        self.busy_source = busy_source
        self._lock = threading.Lock()
        self._enabled = thermometer.available
        self._blind_no_sensor = not self._enabled and require_sensor
        self._last_t: float | None = None
        self._temp: float | None = None
        self._above_s = 0.0
        self._throttled_s = 0.0
        self._errors: Counter[str] = Counter()
        if not self._enabled:
            log.info("thermal governor %s: %s", "blind" if self._blind_no_sensor else "disabled",
                     thermometer.why_unavailable)

    @property
    def enabled(self) -> bool:
        """Whether a thermometer feeds the governor."""
        return self._enabled

    @property
    def duty(self) -> float:
        """The duty the batcher should pace to, in [0, 1]."""
        if not self._enabled:
            return self.governor.config.blind_duty if self._blind_no_sensor else 1.0
        with self._lock:
            return self.governor.duty

    @property
    def state(self) -> str:
        """The state name (``DISABLED`` without a thermometer)."""
        if not self._enabled:
            return "BLIND" if self._blind_no_sensor else "DISABLED"
        with self._lock:
            return self.governor.state.name

    @property
    def serving(self) -> bool:
        """False while STOPPED (GPU lost) or in EMERGENCY: dispatch must stop, health NOT_SERVING."""
        return self.state not in ("STOPPED", "EMERGENCY")

    @property
    def degraded(self) -> bool:
        """True while throttling, holding, blind or in emergency (``appliance health`` exits 1)."""
        return self.state in {s.name for s in _DEGRADED}

    def tick(self) -> float:
        """Take one sample, update the governor and return the new duty."""
        if not self._enabled:
            return self.duty
        now = self.clock.monotonic()
        busy = self.busy_source() if self.busy_source is not None else None
        if isinstance(self.thermometer, SimulatedThermometer):
            self.thermometer.note_busy(busy if busy is not None else self.governor.duty)
        reading = self.thermometer.read()
        with self._lock:
            dt = 0.0 if self._last_t is None else max(now - self._last_t, 0.0)
            self._last_t = now
            if self.governor.duty < 1.0:
                self._throttled_s += dt
            if self._temp is not None and self._temp >= self.governor.config.limit_c:
                self._above_s += dt
            if reading.error is not None:
                self._errors[reading.error] += 1
            duty = self.governor.update(now, reading.temp_c, reading.power_w, busy,
                                        energy_j=reading.energy_j, error=reading.error)
            self._temp = self.governor.last_decision.temp_c
        return duty

    def tick_safely(self) -> float:
        """:meth:`tick`, but a failure inside it (a bug, a wedged driver binding) counts as a failed read.

        The governor then holds and goes blind as for any read error, instead of keeping the last duty.
        """
        try:
            return self.tick()
        except Exception:  # a bug here must not kill pacing silently: fail safe and say so
            log.exception("thermal tick failed; treating it as a failed read")
            with self._lock:
                self._errors["read_error"] += 1
                return self.governor.update(self.clock.monotonic(), None, error="read_error")

    def run(self, stop: threading.Event, period_s: float = 1.0) -> None:
        """Tick every ``period_s`` on the clock until ``stop`` is set (for a daemon thread)."""
        sleep = getattr(self.clock, "sleep", None)
        while not stop.is_set():
            self.tick_safely()
            if sleep is not None:
                sleep(period_s)
            else:
                stop.wait(period_s)

    def snapshot(self) -> ThermalStatus:
        """Return the current :class:`ThermalStatus`."""
        cfg = self.governor.config
        if not self._enabled:
            return ThermalStatus(False, None, self.duty, self.state, 0.0, 0, None,
                                 self.thermometer.why_unavailable or "disabled", setpoint_c=cfg.setpoint_c,
                                 limit_c=cfg.limit_c, source=self.thermometer.name)
        with self._lock:
            d = self.governor.last_decision
            return ThermalStatus(
                True, self._temp, self.governor.duty, self.governor.state.name, self._above_s,
                self.governor.sensor_errors, d.power_w, d.reason, d.budget_w, d.headroom, cfg.setpoint_c,
                cfg.limit_c, self._throttled_s, dict(self._errors), self.thermometer.name,
            )

    def close(self) -> None:
        """Close the thermometer."""
        self.thermometer.close()
