"""Where the governor's samples come from: NVML, nothing, or a simulated GPU plant.

Every source implements :class:`Thermometer`; :func:`make_thermometer` picks one by name
(``auto``, ``nvml``, ``none``, ``sim``), importing ``pynvml`` lazily. NVML failures never escape
``read()``: each NVML error code is mapped to one meaning (:data:`NVML_ERRORS`, notes ``thermal.md``
§2/§6) and reported in :attr:`Reading.error`, which the governor understands.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from appliance.thermal_sim import PRESETS, Fault, Plant, PlantParams, Sensor, SensorParams

__all__ = [
    "NVML_ERRORS",
    "MonotonicClock",
    "NoThermometer",
    "NvmlThermometer",
    "Reading",
    "SimulatedThermometer",
    "Thermometer",
    "make_thermometer",
    "nvml_error_kind",
]

log = logging.getLogger(__name__)


class MonotonicClock(Protocol):
    """Anything with ``monotonic() -> float`` (``appliance.clock.Clock`` fits)."""

    def monotonic(self) -> float:
        """Return monotonic seconds."""
        ...


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


# code -> (pynvml class suffix, error kind, meaning). The governor stops on "lost"/"reset_required".
NVML_ERRORS: dict[int, tuple[str, str, str]] = {
    1: ("Uninitialized", "uninitialized", "NVML not initialised (library unloaded?); treated as a read error"),
    3: ("NotSupported", "not_supported", "query not supported on this GPU: drop that feature"),
    4: ("NoPermission", "no_permission", "needs root: disable the root-only actuator"),
    9: ("DriverNotLoaded", "lost", "NVIDIA driver not loaded (at start: no GPU; later: GPU gone)"),
    10: ("Timeout", "timeout", "NVML timed out: transient read error"),
    12: ("LibraryNotFound", "no_library", "libnvidia-ml.so.1 not found: no GPU on this box"),
    13: ("FunctionNotFound", "function_not_found", "symbol missing in this driver: use the fallback call"),
    15: ("GpuIsLost", "lost", "GPU fell off the bus: stop dispatch, restart the service"),
    16: ("ResetRequired", "reset_required", "GPU needs a reset: stop dispatch, restart the service"),
    26: ("Deprecated", "function_not_found", "call removed in this driver: use the fallback call"),
    27: ("NotReady", "read_error", "value not ready yet: transient read error"),
    999: ("Unknown", "unknown", "unknown NVML error: treated as a read error"),
}
"""NVML error codes and what each means to the governor (notes §2, §6)."""


def nvml_error_kind(exc: BaseException) -> str:
    """Return the error kind (see :data:`NVML_ERRORS`) of an NVML exception; ``read_error`` otherwise."""
    code = getattr(exc, "value", None)
    entry = NVML_ERRORS.get(code) if isinstance(code, int) else None
    return entry[1] if entry else "read_error"


class Thermometer(abc.ABC):
    """A temperature source for the governor.

    Contract: ``read()`` never raises for sensor trouble; it reports it in ``Reading.error``. When
    ``available`` is False the governor is disabled and ``why_unavailable`` says why, in words an
    operator can act on. ``close()`` releases the source and is idempotent.
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

    @abc.abstractmethod
    def read(self) -> Reading:
        """Return one sample."""

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


class NvmlThermometer(Thermometer):
    """GPU temperature, power, energy and clock event reasons through NVML (``nvidia-ml-py``).

    Args:
        index: GPU index.
        nvml: The ``pynvml`` module (or :class:`~appliance.fakes.fake_pynvml.FakePynvml`); imported
            lazily when None.
    """

    name = "nvml"

    def __init__(self, index: int = 0, nvml: ModuleType | Any | None = None) -> None:
        self.index = index
        self._nvml = nvml
        self._handle: object | None = None
        self._why = ""
        self._temp_fn = "nvmlDeviceGetTemperatureV"
        self._reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._dropped: set[str] = set()
        self._open()

    # ----------------------------------------------------------------- setup
    def _open(self) -> None:
        if self._nvml is None:
            try:
                import pynvml  # lazy: heavy optional dependency lives only in this backend
            except ImportError:
                self._why = "no GPU: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
                return
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            if count <= self.index:
                self._why = f"no GPU: NVML reports {count} device(s), index {self.index} requested"
                nv.nvmlShutdown()
                return
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.index)
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == 12:
                self._why = "no GPU: NVML library not found"
            elif code == 9:
                self._why = "no GPU: NVIDIA driver not loaded"
            else:
                self._why = f"NVML init failed: {exc} (code {code})"
            log.info("NVML unavailable: %s", self._why)

    @property
    def available(self) -> bool:
        """Whether NVML is initialised with a device handle."""
        return self._handle is not None

    @property
    def why_unavailable(self) -> str:
        """'no GPU: NVML library not found' on a CPU-only box, etc."""
        return self._why

    @property
    def nvml(self) -> Any:
        """The NVML module in use (for commissioning)."""
        return self._nvml

    @property
    def handle(self) -> object | None:
        """The device handle (None when unavailable)."""
        return self._handle

    # ------------------------------------------------------------------ reads
    def read(self) -> Reading:
        """Return temperature, power, energy and clock reasons; errors are mapped, never raised."""
        if self._handle is None:
            return Reading(None, error="unavailable")
        temp, error = self._read_temperature()
        if error in ("lost", "reset_required"):
            return Reading(None, error=error)
        power = self._secondary("nvmlDeviceGetPowerUsage", 1e-3)
        energy = self._secondary("nvmlDeviceGetTotalEnergyConsumption", 1e-3)
        reasons = self._read_reasons()
        if "lost" in self._dropped:
            return Reading(None, error="lost")
        return Reading(temp, power, energy, reasons, error)

    def _read_temperature(self) -> tuple[float | None, str | None]:
        nv = self._nvml
        for _ in range(2):
            try:
                fn = getattr(nv, self._temp_fn)
                return float(fn(self._handle, nv.NVML_TEMPERATURE_GPU)), None
            except nv.NVMLError as exc:
                kind = nvml_error_kind(exc)
                if kind == "function_not_found":
                    self._temp_fn = ("nvmlDeviceGetTemperature" if self._temp_fn == "nvmlDeviceGetTemperatureV"
                                     else "nvmlDeviceGetTemperatureV")
                    log.warning("NVML temperature call missing; falling back to %s", self._temp_fn)
                    continue
                return None, kind
            except AttributeError:
                self._temp_fn = "nvmlDeviceGetTemperature"
        return None, "function_not_found"

    def _secondary(self, fn_name: str, scale: float) -> float | None:
        if fn_name in self._dropped:
            return None
        nv = self._nvml
        try:
            return float(getattr(nv, fn_name)(self._handle)) * scale
        except nv.NVMLError as exc:
            kind = nvml_error_kind(exc)
            if kind in ("lost", "reset_required"):
                self._dropped.add("lost")
            elif kind in ("not_supported", "function_not_found", "no_permission"):
                self._dropped.add(fn_name)
                log.warning("NVML %s: %s; feature dropped", fn_name, kind)
            return None

    def _read_reasons(self) -> int | None:
        nv = self._nvml
        if self._reasons_fn in self._dropped:
            return None
        try:
            return int(getattr(nv, self._reasons_fn)(self._handle))
        except nv.NVMLError as exc:
            kind = nvml_error_kind(exc)
            if kind == "function_not_found" and self._reasons_fn.endswith("EventReasons"):
                self._reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
            elif kind in ("lost", "reset_required"):
                self._dropped.add("lost")
            elif kind in ("not_supported", "function_not_found", "no_permission"):
                self._dropped.add(self._reasons_fn)
            return None

    def read_fields(self, field_ids: Sequence[int]) -> dict[int, float | str]:
        """Return field values by id; a field whose own return code failed maps to its error kind.

        ``nvmlDeviceGetFieldValues`` only checks the call, so each entry's ``nvmlReturn`` is checked here.
        """
        nv = self._nvml
        if self._handle is None:
            return {fid: "unavailable" for fid in field_ids}
        try:
            values = nv.nvmlDeviceGetFieldValues(self._handle, list(field_ids))
        except nv.NVMLError as exc:
            return {fid: nvml_error_kind(exc) for fid in field_ids}
        out: dict[int, float | str] = {}
        for fid, entry in zip(field_ids, values, strict=True):
            code = int(entry.nvmlReturn)
            if code != 0:
                out[fid] = NVML_ERRORS.get(code, ("", "read_error", ""))[1]
            else:
                out[fid] = float(entry.value.dVal if entry.value.dVal else entry.value.ullVal)
        return out

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        if self._handle is not None and self._nvml is not None:
            self._handle = None
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)


class SimulatedThermometer(Thermometer):
    """A simulated GPU (:class:`~appliance.thermal_sim.Plant`) read through an NVML-like sensor.

    The plant advances with the clock: on each ``read()`` it integrates the time elapsed since the
    previous read at the busy fraction last given to :meth:`note_busy` (what the batcher really
    used). Faults use clock times; ``ambient_c`` and ``fan_scale`` may be changed at any time.

    Args:
        clock: Any object with ``monotonic()``.
        plant: Plant parameters (default: the 5090-like preset).
        sensor: Sensor delay, quantisation and noise.
        ambient_c: Room temperature, °C.
        faults: Sensor faults with clock-time windows.
        seed: Noise seed.
    """

    name = "sim"

    def __init__(self, clock: MonotonicClock, plant: PlantParams | None = None, sensor: SensorParams | None = None,
                 ambient_c: float = 25.0, faults: Sequence[Fault] = (), seed: int = 0) -> None:
        self._clock = clock
        sp = sensor or SensorParams()
        self.plant = Plant(plant, ambient_c, max_delay_s=sp.delay_s + 1)
        self.sensor = Sensor(sp, seed)
        self.faults = list(faults)
        self._busy = 0.0
        self._last_t = clock.monotonic()
        self._last_energy = 0.0
        self._stuck: dict[int, float] = {}

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
        t0 = self._last_t
        self._advance()
        now = self._last_t
        energy = self.plant.energy_j
        power = (energy - self._last_energy) / (now - t0) if now > t0 else self.plant.power_w
        self._last_energy = energy
        value: float | None = self.sensor.read(self.plant)
        for k, f in enumerate(self.faults):
            if f.start_s <= now < f.end_s:
                if f.kind in ("lost", "read_error"):
                    return Reading(None, error=f.kind)
                if f.kind == "stuck":
                    value = self._stuck.setdefault(k, value)
                elif f.kind == "garbage":
                    value = 255.0
        return Reading(value, power, energy, 0x1 if self._busy == 0 else 0, None)


def make_thermometer(kind: str, *, clock: MonotonicClock | None = None, index: int = 0, nvml: Any = None,
                     plant: str | PlantParams = "5090", sensor: SensorParams | None = None,
                     ambient_c: float = 25.0) -> Thermometer:
    """Return the thermometer named ``kind``.

    Args:
        kind: ``"auto"`` (NVML if available, else none), ``"nvml"``, ``"none"`` or ``"sim"``.
        clock: Needed for ``"sim"``; an object with ``monotonic()``.
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
        therm = NvmlThermometer(index, nvml)
        if therm.available or kind == "nvml":
            return therm
        return NoThermometer(therm.why_unavailable)
    if kind == "sim":
        if clock is None:
            raise ValueError("thermal 'sim' needs a clock")
        if isinstance(plant, str):
            if plant not in PRESETS:
                raise ValueError(f"unknown plant preset {plant!r}; choose from {', '.join(sorted(PRESETS))}")
            plant = PRESETS[plant]
        return SimulatedThermometer(clock, plant, sensor, ambient_c)
    raise ValueError(f"thermal source must be one of auto, nvml, none, sim; got {kind!r}")
