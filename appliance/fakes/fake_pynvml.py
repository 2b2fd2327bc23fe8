"""A scriptable stand-in for the ``pynvml`` module (nvidia-ml-py), for tests and ``doctor`` dry runs.

It has the names :class:`~appliance.thermometers.NvmlThermometer` and ``commissioning`` use, and the
same error classes as the real wrapper: ``NVMLError(code)`` builds the per-code subclass
(``NVMLError_GpuIsLost``, ...), each with ``.value``. Script it through attributes::

    nvml = FakePynvml(temperature=65)
    nvml.fail["nvmlDeviceGetTemperatureV"] = nvml.NVML_ERROR_TIMEOUT   # every call fails
    nvml.fail_once["nvmlDeviceGetPowerUsage"] = nvml.NVML_ERROR_UNKNOWN  # next call fails
    nvml.missing.add("nvmlDeviceGetTemperatureV")                     # FunctionNotFound
    nvml.field_errors[196] = nvml.NVML_ERROR_NOT_SUPPORTED             # per-field return code
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FakeFieldValue", "FakePynvml"]

_CODES = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "IRQ_ISSUE": 11, "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14, "GPU_IS_LOST": 15, "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17, "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "MEMORY": 20, "NO_DATA": 21,
    "DEPRECATED": 26, "NOT_READY": 27, "GPU_NOT_FOUND": 28, "INVALID_STATE": 29, "UNKNOWN": 999,
}


class NVMLError(Exception):
    """Base NVML error; ``NVMLError(code)`` returns the per-code subclass, like pynvml."""

    _by_code: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int = 999) -> NVMLError:  # noqa: D102
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _make_classes() -> dict[str, type[NVMLError]]:
    out: dict[str, type[NVMLError]] = {}
    for name, code in _CODES.items():
        cls_name = "NVMLError_" + "".join(part.capitalize() for part in name.split("_"))

        def new(cls: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            obj = Exception.__new__(cls)
            obj.value = _code
            return obj

        cls = type(cls_name, (NVMLError,), {"__new__": new})
        NVMLError._by_code[code] = cls
        out[cls_name] = cls
    return out


_CLASSES = _make_classes()


@dataclass
class FakeFieldValue:
    """One ``nvmlFieldValue_t``: its own return code and a value union."""

    fieldId: int  # noqa: N815  (pynvml's spelling)
    nvmlReturn: int  # noqa: N815
    value: Any


@dataclass
class _Value:
    dVal: float = 0.0  # noqa: N815
    uiVal: int = 0  # noqa: N815
    ullVal: int = 0  # noqa: N815
    siVal: int = 0  # noqa: N815


class FakePynvml:
    """A fake ``pynvml`` module with one scriptable GPU.

    Args:
        temperature: °C, or a callable returning it (called per read).
        power_mw: Power usage, mW, or a callable.
        device_count: Number of GPUs ``nvmlDeviceGetCount`` reports.
        init_error: An NVML code ``nvmlInit`` raises (e.g. 12 LibraryNotFound on a CPU-only box).
    """

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_SUCCESS = 0
    NVML_FI_DEV_POWER_AVERAGE = 185
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT = 193
    NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT = 194
    NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT = 195
    NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT = 196

    def __init__(self, temperature: float | Callable[[], float] = 50, power_mw: int | Callable[[], int] = 100_000,
                 device_count: int = 1, init_error: int | None = None) -> None:
        for name, code in _CODES.items():
            setattr(self, f"NVML_ERROR_{name}", code)
        for cls_name, cls in _CLASSES.items():
            setattr(self, cls_name, cls)
        self.temperature = temperature
        self.power_mw = power_mw
        self.energy_mj = 0
        self.clock_reasons = 0x1
        self.device_count = device_count
        self.init_error = init_error
        self.fail: dict[str, int] = {}
        self.fail_once: dict[str, int] = {}
        self.missing: set[str] = set()
        self.fields: dict[int, float] = {193: 98.0, 194: 91.0, 195: 95.0, 196: 88.0, 185: 100.0, 186: 100.0}
        self.field_errors: dict[int, int] = {}
        self.power_limit_mw = 575_000
        self.initialized = False
        self.calls: list[str] = []

    # ---------------------------------------------------------------- plumbing
    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.missing:
            raise NVMLError(13)
        if name != "nvmlInit" and not self.initialized:
            raise NVMLError(1)
        code = self.fail_once.pop(name, None) or self.fail.get(name)
        if code:
            raise NVMLError(code)

    @staticmethod
    def _value(v: float | Callable[[], float]) -> float:
        return v() if callable(v) else v

    # ------------------------------------------------------------------- API
    def nvmlInit(self) -> None:  # noqa: N802
        """Initialise, or raise ``init_error``."""
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        """Shut down."""
        self._call("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        """Return the number of devices."""
        self._call("nvmlDeviceGetCount")
        return self.device_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        """Return an opaque handle."""
        self._call("nvmlDeviceGetHandleByIndex")
        if index >= self.device_count:
            raise NVMLError(2)
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle: object) -> str:  # noqa: N802
        """Return the product name."""
        self._call("nvmlDeviceGetName")
        return "Fake RTX"

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        """Return the driver version string (``doctor --gpu`` reports it)."""
        self._call("nvmlSystemGetDriverVersion")
        return "580.00"

    def nvmlDeviceGetTemperatureV(self, handle: object, sensor: int = 0) -> int:  # noqa: N802
        """Return the integer temperature, °C."""
        self._call("nvmlDeviceGetTemperatureV")
        return int(self._value(self.temperature))

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:  # noqa: N802
        """Return the integer temperature, °C (deprecated API)."""
        self._call("nvmlDeviceGetTemperature")
        return int(self._value(self.temperature))

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:  # noqa: N802
        """Return power, mW."""
        self._call("nvmlDeviceGetPowerUsage")
        return int(self._value(self.power_mw))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:  # noqa: N802
        """Return energy since driver load, mJ."""
        self._call("nvmlDeviceGetTotalEnergyConsumption")
        return int(self.energy_mj)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:  # noqa: N802
        """Return the clock event reasons bitmask."""
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return self.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:  # noqa: N802
        """Return the clock event reasons bitmask (deprecated API)."""
        self._call("nvmlDeviceGetCurrentClocksThrottleReasons")
        return self.clock_reasons

    def nvmlDeviceGetFieldValues(self, handle: object, field_ids: Sequence[int]) -> list[FakeFieldValue]:  # noqa: N802
        """Return one value per field, each with its own return code."""
        self._call("nvmlDeviceGetFieldValues")
        out = []
        for fid in field_ids:
            code = self.field_errors.get(fid, 0 if fid in self.fields else 3)
            v = self.fields.get(fid, 0.0)
            out.append(FakeFieldValue(fid, code, _Value(dVal=v, uiVal=int(v), ullVal=int(v), siVal=int(v))))
        return out

    def nvmlDeviceGetPowerManagementLimit(self, handle: object) -> int:  # noqa: N802
        """Return the power limit, mW."""
        self._call("nvmlDeviceGetPowerManagementLimit")
        return self.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object) -> tuple[int, int]:  # noqa: N802
        """Return (min, max) power limit, mW."""
        self._call("nvmlDeviceGetPowerManagementLimitConstraints")
        return (self.power_limit_mw // 2, self.power_limit_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle: object, limit_mw: int) -> None:  # noqa: N802
        """Set the power limit, mW (root only on real hardware)."""
        self._call("nvmlDeviceSetPowerManagementLimit")
        self.power_limit_mw = int(limit_mw)
