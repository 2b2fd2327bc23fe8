"""The small loop that feeds the governor from a thermometer, and the status it exposes.

The batcher owns pacing; it sets :attr:`ThermalController.busy_source` (the fraction of the last
period the engine computed) and reads :attr:`ThermalController.duty`. Something calls :meth:`tick`
about once per second (:meth:`run` does, on a clock). Status, metrics and health read
:meth:`snapshot`, :attr:`serving` and :attr:`degraded`; all three are thread-safe. States are
:class:`~appliance.thermal.governor.GovernorState` members; :func:`health_action` says what the health
module should do about a snapshot (the transitions themselves belong to the health module).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from appliance.clock import Clock, RealClock
from appliance.thermal.governor import Governor, GovernorState, ThermalConfig
from appliance.thermal.memory import Learned, ThermalMemory
from appliance.thermal.source import Thermometer

__all__ = ["HealthAction", "ThermalController", "ThermalStatus", "health_action"]

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
    # Governor state name (``GovernorState.<x>.name``): DISABLED, COOL, REGULATING, THROTTLING, HOLDING,
    # BLIND, EMERGENCY, STOPPED. ``governor_state`` is the enum member itself.
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
    # The governor's state as the enum (``state`` is its name).
    governor_state: GovernorState = GovernorState.DISABLED

    @property
    def degraded(self) -> bool:
        """True while throttling, holding, blind or in emergency (``appliance health`` exits 1)."""
        return self.governor_state in _DEGRADED


class ThermalController:
    """Reads the thermometer, drives the governor, and records what happened.

    Args:
        thermometer: The sample source; unavailable → governor disabled (duty 1, state DISABLED),
            unless ``require_sensor`` (a GPU engine is in use), then BLIND at the blind duty.
        governor: The governor (default: ``Governor(ThermalConfig())``).
        clock: The clock (default: the real one).
        busy_source: Returns the fraction of the last period the engine computed.
        require_sensor: Treat a missing sensor as blind rather than disabled.
        memory: Where the governor's learning is kept across restarts: recalled at the first sample, written
            every :data:`~appliance.thermal.memory.KEEP_EVERY_S` and on :meth:`close` (docs/thermal.md, "Restarts").
    """

    def __init__(self, thermometer: Thermometer, governor: Governor | None = None,
                 clock: Clock | None = None, busy_source: Callable[[], float] | None = None,
                 require_sensor: bool = False, memory: ThermalMemory | None = None) -> None:
        self.thermometer = thermometer
        self.governor = governor or Governor(ThermalConfig())
        self.clock: Clock = clock or RealClock()
        self.busy_source = busy_source
        self._lock = threading.Lock()
        self._enabled = thermometer.available
        self._blind_no_sensor = not self._enabled and require_sensor
        self._last_t: float | None = None
        self._temp: float | None = None
        self._above_s = 0.0
        self._throttled_s = 0.0
        self._errors: Counter[str] = Counter()
        if self._blind_no_sensor:  # a GPU engine without a sensor: paced at the blind duty, worth a WARNING
            log.warning("thermal governor blind: %s (dispatch paced at the blind duty %.2f until a restart finds "
                        "the sensor)", thermometer.why_unavailable, self.governor.config.blind_duty)
        elif not self._enabled:
            log.info("thermal governor disabled: %s", thermometer.why_unavailable)
        self.memory = memory if self._enabled else None
        if self.memory is not None:
            self.memory.load()  # read now, at start: the first sample only parses it, under the lock
        self._recall_pending = self.memory is not None
        self.resumed_after_s: float | None = None
        """How long before the first sample the memory this governor resumed from was kept, s (None: afresh)."""

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
    def governor_state(self) -> GovernorState:
        """The state (``DISABLED`` without a thermometer, ``BLIND`` without one when a sensor is required)."""
        if not self._enabled:
            return GovernorState.BLIND if self._blind_no_sensor else GovernorState.DISABLED
        with self._lock:
            return self.governor.state

    @property
    def state(self) -> str:
        """The state's name (``GovernorState.<x>.name``)."""
        return self.governor_state.name

    @property
    def serving(self) -> bool:
        """False while STOPPED (GPU lost) or in EMERGENCY: dispatch must stop, health NOT_SERVING."""
        return self.governor_state < GovernorState.EMERGENCY

    @property
    def degraded(self) -> bool:
        """True while throttling, holding, blind or in emergency (``appliance health`` exits 1)."""
        return self.governor_state in _DEGRADED

    def tick(self) -> float:
        """Take one sample, update the governor and return the new duty."""
        if not self._enabled:
            return self.duty
        busy = self.busy_source() if self.busy_source is not None else None
        self.thermometer.note_busy(busy if busy is not None else self.governor.duty)
        reading = self.thermometer.read()
        # stamped when the read returns, as the energy counter is: a read that blocked 5 s and was stamped before
        # it made the governor see 6x the power and judge a healthy sensor stuck (held-out review, session 14)
        now = self.clock.monotonic()
        with self._lock:
            dt = 0.0 if self._last_t is None else max(now - self._last_t, 0.0)
            self._last_t = now
            if self.governor.duty < 1.0:
                self._throttled_s += dt
            if self._temp is not None and self._temp >= self.governor.config.limit_c:
                self._above_s += dt
            if reading.error is not None:
                self._errors[reading.error] += 1
            self._recall(now)
            duty = self.governor.update(now, reading.temp_c, reading.power_w, busy,
                                        energy_j=reading.energy_j, error=reading.error)
            # the last good reading itself, as documented: status showed 0 °C in HOLDING/BLIND, and in regulation
            # the reading plus the governor's lead term (up to 1.4 °C above the sensor; reviews, session 14)
            if self.governor.last_decision.reading_c is not None:
                self._temp = self.governor.last_decision.reading_c
            learned = self.governor.learned() if self.memory is not None and self.memory.due(now) else None
        self._keep(now, learned)
        return duty

    def _recall(self, now: float) -> None:
        """Resume what the last daemon's governor learned, once, at the first sample.

        Not when the controller is made: the engine may take minutes to build after that, and the GPU idles
        meanwhile, so the models must cool for all of it.
        """
        if not self._recall_pending or self.memory is None:
            return
        self._recall_pending = False
        found = self.memory.recall(now)
        if found is None:
            return
        learned, away_s = found
        self.governor.resume(learned, away_s)
        self.resumed_after_s = away_s
        log.info("thermal governor resumed what it learned %.0f s ago (budget %s, %.0f W per duty)", away_s,
                 "none yet" if learned.integral_w is None else f"{learned.integral_w:.0f} W", learned.w_per_duty)

    def _keep(self, now: float, learned: Learned | None) -> None:
        """Write the governor's learning (outside the lock: a slow disk must not hold status or pacing)."""
        if self.memory is not None and learned is not None:
            self.memory.keep(now, learned)

    def tick_safely(self) -> float:
        """:meth:`tick`, but a failure inside it (a bug, a wedged driver binding) counts as a failed read.

        The governor then holds and goes blind as for any read error, instead of keeping the last duty.
        """
        try:
            return self.tick()
        except Exception:  # a bug here must not kill pacing silently: fail safe and say so
            log.exception("thermal tick failed; treating it as a failed read")
            return self.tick_missing("read_error")

    def tick_missing(self, error: str = "timeout") -> float:
        """A read that has not answered in time: a failed read for the governor (HOLDING, then BLIND).

        The daemon's loop calls it while a read hangs in its thread (an NVML call can block for seconds); the
        governor then holds the last duty for at most ``hold_s`` and goes to the blind duty, as for any read error.
        """
        if not self._enabled:
            return self.duty
        with self._lock:
            self._errors[error] += 1
            now = self.clock.monotonic()
            self._recall(now)
            return self.governor.update(now, None, error=error)

    def run(self, stop: threading.Event, period_s: float = 1.0) -> None:
        """Tick every ``period_s`` on the clock until ``stop`` is set (for a daemon thread)."""
        while not stop.is_set():
            self.tick_safely()
            self.clock.sleep(period_s)

    def snapshot(self) -> ThermalStatus:
        """Return the current :class:`ThermalStatus`."""
        cfg = self.governor.config
        if not self._enabled:
            gs = self.governor_state
            return ThermalStatus(False, None, self.duty, gs.name, 0.0, 0, None,
                                 self.thermometer.why_unavailable or "disabled", setpoint_c=cfg.setpoint_c,
                                 limit_c=cfg.limit_c, source=self.thermometer.name, governor_state=gs)
        with self._lock:
            d = self.governor.last_decision
            return ThermalStatus(
                True, self._temp, self.governor.duty, self.governor.state.name, self._above_s,
                self.governor.sensor_errors, d.power_w, d.reason, d.budget_w, d.headroom, cfg.setpoint_c,
                cfg.limit_c, self._throttled_s, dict(self._errors), self.thermometer.name, self.governor.state,
            )

    def close(self) -> None:
        """Keep what the governor learned (once it has run), waiting at most 2 s for the disk; close the thermometer."""
        with self._lock:
            learned = self.governor.learned() if self._last_t is not None else None
        self._keep(self.clock.monotonic(), learned)
        if self.memory is not None and not self.memory.flush(2.0):
            log.warning("thermal memory %s not written within 2 s at stop", self.memory.path)
        self.thermometer.close()


class HealthAction(enum.Enum):
    """What the service's health should do about the thermal state (see :func:`health_action`)."""

    SERVE = "serve"  # serving; the thermal health name SERVING
    SERVE_DEGRADED = "serve_degraded"  # serving, but the thermal health name NOT_SERVING (blind)
    PAUSE = "pause"  # NOT_SERVING until the governor recovers; fail queued work UNAVAILABLE (EMERGENCY)
    STOP = "stop"  # NOT_SERVING for good; fail queued work, stop the watchdog so systemd restarts (STOPPED)


def health_action(snapshot: ThermalStatus) -> tuple[HealthAction, str]:
    """Map a thermal snapshot to what health should be, and a reason for the operator. Pure.

    ================================  ==============  ================================================
    governor state                    action          inference health / ``appliance.thermal`` name
    ================================  ==============  ================================================
    DISABLED, COOL, REGULATING        SERVE           SERVING / SERVING
    THROTTLING, HOLDING               SERVE           SERVING / SERVING (degraded in status/metrics)
    BLIND                             SERVE_DEGRADED  SERVING / NOT_SERVING
    EMERGENCY                         PAUSE           NOT_SERVING until recovered / NOT_SERVING
    STOPPED                           STOP            NOT_SERVING, restart / NOT_SERVING
    ================================  ==============  ================================================

    The health module (``appliance/serving/health.py``) owns the transitions; the thermal loop only asks this.
    """
    gs = snapshot.governor_state
    reason = f"thermal {gs.name.lower()}: {snapshot.reason}"
    if gs is GovernorState.STOPPED:
        return HealthAction.STOP, reason
    if gs is GovernorState.EMERGENCY:
        return HealthAction.PAUSE, reason
    if gs is GovernorState.BLIND:
        return HealthAction.SERVE_DEGRADED, reason
    return HealthAction.SERVE, reason
