"""The thermometer boundary: one :class:`Reading` per control period from NVML, a simulation, or nothing.

Every source implements :class:`Thermometer`; :func:`make_thermometer` picks one by name (``auto``, ``nvml``,
``none``, ``sim``) and imports the chosen backend lazily, so the NVML path never loads the simulator.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from appliance.clock import Clock

if TYPE_CHECKING:
    from appliance.thermal.plant import PlantParams, SensorParams

__all__ = ["NoThermometer", "Reading", "Thermometer", "make_thermometer"]


@dataclass(frozen=True)
class Reading:
    """One sample. A failed temperature read has ``temp_c=None`` and an ``error`` kind."""

    # GPU sensor temperature, °C; None when the read failed.
    temp_c: float | None
    # Average power over about the last second, W; None when unknown or unsupported.
    power_w: float | None = None
    # Energy counter since driver load, J; None when unsupported.
    energy_j: float | None = None
    # Clock event reasons bitmask (NVML), None when unsupported.
    clock_reasons: int | None = None
    # Error kind of the temperature read: "lost", "reset_required", "read_error", "timeout",
    # "not_supported", "no_permission", "uninitialized", "unknown"; None when it succeeded.
    error: str | None = None


class Thermometer(abc.ABC):
    """A temperature source for the governor.

    Contract: ``read()`` never raises for sensor trouble; it reports it in ``Reading.error``. When
    ``available`` is False the governor is disabled and ``why_unavailable`` says why, in words an
    operator can act on. ``close()`` releases the source and is idempotent. ``note_busy(busy)`` tells a
    source that models the GPU (the simulation) what the batcher used; real sources ignore it.
    """

    name: str = "thermometer"

    @property
    def available(self) -> bool:
        """Whether this source can provide readings."""
        return True

    @property
    def why_unavailable(self) -> str:
        """Why ``available`` is False ('' when available)."""
        return ""

    @property
    def identity(self) -> str:
        """Which GPU this is, as far as the source knows (NVML: its UUID); what the governor learned belongs to it."""
        return self.name

    @abc.abstractmethod
    def read(self) -> Reading:
        """Return one sample."""

    def note_busy(self, busy: float) -> None:  # noqa: B027 - optional hook, deliberately empty
        """Hear the busy fraction the batcher used since the last call (only simulations care)."""

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately empty
        """Release the source."""


class NoThermometer(Thermometer):
    """No sensor: the governor is disabled (duty 1) and the status says so."""

    name = "none"

    def __init__(self, reason: str = "thermal governor disabled by configuration") -> None:
        self._reason = reason

    @property
    def available(self) -> bool:
        """Always False."""
        return False

    @property
    def why_unavailable(self) -> str:
        """The reason given at construction."""
        return self._reason

    def read(self) -> Reading:
        """Return an empty reading (``error="disabled"``)."""
        return Reading(None, error="disabled")


def make_thermometer(kind: str, *, clock: Clock | None = None, index: int = 0, nvml: Any = None,
                     plant: str | PlantParams = "5090", sensor: SensorParams | None = None,
                     ambient_c: float = 25.0) -> Thermometer:
    """Return the thermometer named ``kind``.

    Args:
        kind: ``"auto"`` (NVML if available, else none), ``"nvml"``, ``"none"`` or ``"sim"``.
        clock: Needed for ``"sim"``.
        index: GPU index for NVML.
        nvml: A ``pynvml``-like module (tests pass the fake).
        plant: Preset name or parameters for ``"sim"``.
        sensor: Sensor parameters for ``"sim"``.
        ambient_c: Room temperature for ``"sim"``, °C.

    Raises:
        ValueError: Unknown ``kind`` or plant preset, or ``"sim"`` without a clock.
    """
    if kind == "none":
        return NoThermometer()
    if kind in ("nvml", "auto"):
        from appliance.thermal.nvml import NvmlThermometer

        therm = NvmlThermometer(index, nvml)
        if therm.available or kind == "nvml":
            return therm
        return NoThermometer(therm.why_unavailable)
    if kind == "sim":
        if clock is None:
            raise ValueError("thermal 'sim' needs a clock")
        from appliance.thermal.plant import PRESETS
        from appliance.thermal.simulated import SimulatedThermometer

        if isinstance(plant, str):
            if plant not in PRESETS:
                raise ValueError(f"unknown plant preset {plant!r}; choose from {', '.join(sorted(PRESETS))}")
            plant = PRESETS[plant]
        return SimulatedThermometer(clock, plant, sensor, ambient_c)
    raise ValueError(f"thermal source must be one of auto, nvml, none, sim; got {kind!r}")
