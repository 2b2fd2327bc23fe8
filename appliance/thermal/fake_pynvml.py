"""A scriptable stand-in for the ``pynvml`` module (nvidia-ml-py), for tests and ``doctor`` dry runs.

Faithful by construction: its constants (``NVML_ERROR_*``, ``NVML_VALUE_TYPE_*``, ``NVML_FI_*``, ...), its
exceptions (``NVMLError(code)`` builds the real per-code subclass such as ``pynvml.NVMLError_GpuIsLost``) and
its field values (the real ``c_nvmlFieldValue_t`` ctypes structure, with only the union member named by
``valueType`` written) are taken from the installed nvidia-ml-py, and every ``nvml*`` method has the real
function's signature (tests/unit/test_fake_pynvml.py compares them). Script it through attributes::

    nvml = FakePynvml(temperature=65)
    nvml.fail["nvmlDeviceGetTemperatureV"] = nvml.NVML_ERROR_TIMEOUT     # every call fails
    nvml.fail_once["nvmlDeviceGetPowerUsage"] = nvml.NVML_ERROR_UNKNOWN   # next call fails
    nvml.missing.add("nvmlDeviceGetTemperatureV")                       # FunctionNotFound
    nvml.field_errors[196] = nvml.NVML_ERROR_NOT_SUPPORTED               # per-field return code
    nvml.fields[194] = (nvml.NVML_VALUE_TYPE_UNSIGNED_INT, 91)           # value type and value
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pynvml

__all__ = ["FakePynvml"]

_CONSTANT_PREFIXES = ("NVML_ERROR_", "NVML_VALUE_TYPE_", "NVML_FI_DEV_", "NVML_TEMPERATURE_", "NVML_SUCCESS",
                      "nvmlTemperature_v")
_UNION_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class _Module:
    """Class attributes copied from the real pynvml: constants, ``NVMLError`` and its per-code subclasses."""

    NVMLError = pynvml.NVMLError


for _name in dir(pynvml):
    if _name.startswith(_CONSTANT_PREFIXES) or _name.startswith("NVMLError_"):
        setattr(_Module, _name, getattr(pynvml, _name))


class FakePynvml(_Module):
    """A fake ``pynvml`` module with one scriptable GPU.

    Args:
        temperature: °C, or a callable returning it (called per read).
        power_mw: Power usage, mW, or a callable.
        device_count: Number of GPUs ``nvmlDeviceGetCount`` reports.
        init_error: An NVML code ``nvmlInit`` raises (e.g. ``NVML_ERROR_LIBRARY_NOT_FOUND`` on a CPU-only box).
    """

    def __init__(self, temperature: float | Callable[[], float] = 50, power_mw: int | Callable[[], int] = 100_000,
                 device_count: int = 1, init_error: int | None = None) -> None:
        self.temperature = temperature
        self.power_mw = power_mw
        self.energy_mj = 0
        self.clock_reasons = 0x1
        self.device_count = device_count
        self.init_error = init_error
        self.fail: dict[str, int] = {}
        self.fail_once: dict[str, int] = {}
        self.missing: set[str] = set()
        # call name -> an event the call waits for before it answers: a driver call that blocks (a GPU falling off
        # the bus, a busy driver) as the real library's can, for seconds
        self.block: dict[str, threading.Event] = {}
        uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        # field id -> (valueType, value); T.Limit fields and average/instant power (mW)
        self.fields: dict[int, tuple[int, float]] = {
            pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: (uint, 98),
            pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: (uint, 91),
            pynvml.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT: (uint, 95),
            pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: (uint, 88),
            pynvml.NVML_FI_DEV_POWER_AVERAGE: (uint, 100_000),
            pynvml.NVML_FI_DEV_POWER_INSTANT: (uint, 100_000),
        }
        self.field_errors: dict[int, int] = {}
        self.power_limit_mw = 575_000
        self.initialized = False
        self.calls: list[str] = []

    # ---------------------------------------------------------------- plumbing
    def _call(self, name: str) -> None:
        self.calls.append(name)
        gate = self.block.get(name)
        if gate is not None:
            gate.wait()
        if name in self.missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        code = self.fail_once.pop(name, None) or self.fail.get(name)
        if code:
            raise pynvml.NVMLError(code)

    @staticmethod
    def _value(v: float | Callable[[], float]) -> float:
        return v() if callable(v) else v

    # ------------------------------------------------------------------- API
    def nvmlInit(self) -> None:  # noqa: N802
        """Initialise, or raise ``init_error``."""
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        """Shut down."""
        self._call("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        """Return the driver version string."""
        self._call("nvmlSystemGetDriverVersion")
        return "580.00.00-fake"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        """Return the number of devices."""
        self._call("nvmlDeviceGetCount")
        return self.device_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        """Return an opaque handle."""
        self._call("nvmlDeviceGetHandleByIndex")
        if index >= self.device_count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle: object) -> str:  # noqa: N802
        """Return the product name."""
        self._call("nvmlDeviceGetName")
        return "Fake RTX"

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # noqa: N802
        """Return the GPU's UUID (``GPU-`` and a per-index made-up value)."""
        self._call("nvmlDeviceGetUUID")
        return f"GPU-fa4e0000-0000-4000-8000-{handle[1] if isinstance(handle, tuple) else 0:012d}"

    def nvmlDeviceGetTemperatureV(self, handle: object, sensor: int,  # noqa: N802
                                  version: int = pynvml.nvmlTemperature_v1) -> int:
        """Return the integer temperature, °C."""
        self._call("nvmlDeviceGetTemperatureV")
        if version != pynvml.nvmlTemperature_v1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
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

    def nvmlDeviceGetFieldValues(self, handle: object, fieldIds: list[int]) -> Any:  # noqa: N802, N803
        """Return a ctypes array of ``c_nvmlFieldValue_t``, each with its own return code.

        Like the driver, only the union member named by ``valueType`` is written.
        """
        self._call("nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for entry, fid in zip(values, fieldIds, strict=True):
            entry.fieldId = fid
            if fid not in self.fields:
                entry.nvmlReturn = self.field_errors.get(fid, pynvml.NVML_ERROR_NOT_SUPPORTED)
                continue
            entry.nvmlReturn = self.field_errors.get(fid, pynvml.NVML_SUCCESS)
            if entry.nvmlReturn != pynvml.NVML_SUCCESS:
                continue
            value_type, value = self.fields[fid]
            entry.valueType = value_type
            member = _UNION_MEMBER[value_type]
            setattr(entry.value, member, float(value) if member == "dVal" else int(value))
        return values

    def nvmlDeviceGetPowerManagementLimit(self, handle: object) -> int:  # noqa: N802
        """Return the power limit, mW."""
        self._call("nvmlDeviceGetPowerManagementLimit")
        return self.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object) -> list[int]:  # noqa: N802
        """Return [min, max] power limit, mW."""
        self._call("nvmlDeviceGetPowerManagementLimitConstraints")
        return [self.power_limit_mw // 2, self.power_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: object, limit: int) -> None:  # noqa: N802
        """Set the power limit, mW (root only on real hardware)."""
        self._call("nvmlDeviceSetPowerManagementLimit")
        self.power_limit_mw = int(limit)
