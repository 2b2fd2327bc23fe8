"""A simulated GPU (:class:`~appliance.thermal.plant.Plant`) behind the :class:`Thermometer` interface.

Used by ``serve --thermal sim``, ``doctor --thermal --sim`` and tests: the plant advances with the clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.clock import Clock
from appliance.thermal.plant import Fault, FaultInjector, Plant, PlantParams, Sensor, SensorParams
from appliance.thermal.source import Reading, Thermometer

__all__ = ["SimulatedThermometer"]


class SimulatedThermometer(Thermometer):
    """A simulated GPU read through an NVML-like sensor.

    The plant advances with the clock: on each ``read()`` it integrates the time elapsed since the
    previous read at the busy fraction last given to :meth:`note_busy` (what the batcher really
    used). Faults use clock times; ``ambient_c`` and ``plant.fan_scale`` may be changed at any time.

    Args:
        clock: The clock (a ``ManualClock`` in tests).
        plant: Plant parameters (default: the 5090-like preset).
        sensor: Sensor delay, quantisation and noise.
        ambient_c: Room temperature, °C.
        faults: Sensor faults with clock-time windows.
        seed: Noise seed.
    """

    name = "sim"

    def __init__(self, clock: Clock, plant: PlantParams | None = None, sensor: SensorParams | None = None,
                 ambient_c: float = 25.0, faults: Sequence[Fault] = (), seed: int = 0) -> None:
        self._clock = clock
        sp = sensor or SensorParams()
        self.plant = Plant(plant, ambient_c, max_delay_s=sp.delay_s + 1)
        self.sensor = Sensor(sp, seed)
        self.faults = FaultInjector(list(faults), seed)
        self._busy = 0.0
        self._last_t = clock.monotonic()
        self._last_read = (self._last_t, 0.0)  # (time, plant energy) of the last read

    @property
    def ambient_c(self) -> float:
        """Room temperature, °C."""
        return self.plant.ambient_c

    @ambient_c.setter
    def ambient_c(self, value: float) -> None:
        self.plant.ambient_c = value

    def note_busy(self, busy: float) -> None:
        """Advance the plant to now at the previous busy fraction, then use ``busy`` from now on."""
        self._advance()
        self._busy = min(max(busy, 0.0), 1.0)

    def _advance(self) -> None:
        now = self._clock.monotonic()
        if now > self._last_t:
            self.plant.advance(now - self._last_t, self._busy)
            self._last_t = now

    def read(self) -> Reading:
        """Advance the plant to the clock's now and return a sensor sample with power and energy."""
        self._advance()
        now = self._last_t
        energy = self.plant.energy_j
        # the average since the last read, as NVML's counter gives it: note_busy() advances the plant in between,
        # and the energy since then over the time since then read 7795 W at a daemon's first read (session 22)
        t0, e0 = self._last_read
        power = (energy - e0) / (now - t0) if now > t0 else self.plant.power_w
        self._last_read = (now, energy)
        value, error = self.faults.apply(now, self.sensor.read(self.plant))
        if error is not None:
            return Reading(None, error=error)
        return Reading(value, power, energy, 0x1 if self._busy == 0 else 0, None)
