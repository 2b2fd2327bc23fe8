"""GPU temperature, power and energy through NVML (``nvidia-ml-py``, imported as ``pynvml``).

NVML failures never escape :meth:`NvmlThermometer.read`: each error code (pynvml's own ``NVML_ERROR_*``
constants) maps to one meaning in :data:`NVML_ERRORS` (``docs/thermal.md``) and is reported in
:attr:`Reading.error`, which the governor understands. Field values are decoded by their ``valueType``
(:func:`field_value`): ``nvmlFieldValue_t.value`` is a C union, and reading the wrong member of it gives
garbage (an unsigned 90 read as ``dVal`` is 4.4e-322). This module never imports the simulator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pynvml

from appliance.thermal.source import Reading, Thermometer

__all__ = ["NVML_ERRORS", "NvmlThermometer", "field_value", "nvml_error_kind"]

log = logging.getLogger(__name__)

#: Reads between tries of a power or energy call that said it is unsupported (about 5 min at 1 Hz).
_SECONDARY_RETRY_READS = 300

_KINDS: dict[str, tuple[str, str]] = {
    "UNINITIALIZED": ("uninitialized", "NVML not initialised (shut down by another user?): a read error; NVML is "
                      "opened again after a few"),
    "INVALID_ARGUMENT": ("stale_handle", "the device handle is not valid any more (GPUs renumbered?): a read error; "
                         "NVML is opened again after a few"),
    "NOT_SUPPORTED": ("not_supported", "query not supported on this GPU: drop that feature"),
    "NO_PERMISSION": ("no_permission", "needs root: disable the root-only actuator"),
    "DRIVER_NOT_LOADED": ("lost", "NVIDIA driver not loaded (at start: no GPU; later: GPU gone)"),
    "TIMEOUT": ("timeout", "NVML timed out: transient read error"),
    "LIBRARY_NOT_FOUND": ("no_library", "libnvidia-ml.so.1 not found: no GPU on this box"),
    "FUNCTION_NOT_FOUND": ("function_not_found", "symbol missing in this driver: use the fallback call"),
    "GPU_IS_LOST": ("lost", "GPU fell off the bus: stop dispatch, restart the service"),
    "RESET_REQUIRED": ("reset_required", "GPU needs a reset: stop dispatch, restart the service"),
    "DEPRECATED": ("function_not_found", "call removed in this driver: use the fallback call"),
    "NOT_READY": ("read_error", "value not ready yet: transient read error"),
    "UNKNOWN": ("unknown", "unknown NVML error: treated as a read error"),
}

NVML_ERRORS: dict[int, tuple[str, str, str]] = {
    getattr(pynvml, "NVML_ERROR_" + name): (
        pynvml.nvmlExceptionClass(getattr(pynvml, "NVML_ERROR_" + name)).__name__, kind, meaning)
    for name, (kind, meaning) in _KINDS.items()
    if hasattr(pynvml, "NVML_ERROR_" + name)
}
"""NVML error code -> (pynvml exception class name, error kind, meaning). The governor stops on
``lost``/``reset_required``; every other kind of a failed temperature read is a read error."""

_LOST = ("lost", "reset_required")

#: Failed reads in a row of these kinds after which NVML is initialised again and the device handle taken anew: left
#: alone, the governor stayed BLIND for good though NVML would answer again (held-out review, session 19).
_STALE = ("uninitialized", "stale_handle")
_REOPEN_AFTER = 3

# nvmlValueType_t -> the member of the c_nvmlValue_t union that holds the value
_UNION_MEMBER: dict[int, str] = {
    getattr(pynvml, "NVML_VALUE_TYPE_" + name): member
    for name, member in (("DOUBLE", "dVal"), ("UNSIGNED_INT", "uiVal"), ("UNSIGNED_LONG", "ulVal"),
                         ("UNSIGNED_LONG_LONG", "ullVal"), ("SIGNED_LONG_LONG", "sllVal"),
                         ("SIGNED_INT", "siVal"), ("UNSIGNED_SHORT", "usVal"))
    if hasattr(pynvml, "NVML_VALUE_TYPE_" + name)
}


def nvml_error_kind(exc: BaseException) -> str:
    """Return the error kind (see :data:`NVML_ERRORS`) of an NVML exception; ``read_error`` otherwise."""
    code = getattr(exc, "value", None)
    entry = NVML_ERRORS.get(code) if isinstance(code, int) else None
    return entry[1] if entry else "read_error"


def field_value(entry: Any) -> float:
    """Decode one ``nvmlFieldValue_t`` by its ``valueType``.

    Raises:
        ValueError: An unknown ``valueType`` (a newer driver than this table knows).
    """
    member = _UNION_MEMBER.get(int(entry.valueType))
    if member is None:
        raise ValueError(f"NVML field {int(entry.fieldId)}: unknown valueType {int(entry.valueType)}")
    return float(getattr(entry.value, member))


class NvmlThermometer(Thermometer):
    """GPU temperature, power, energy and clock event reasons through NVML (``nvidia-ml-py``).

    Args:
        index: GPU index.
        nvml: The ``pynvml`` module (default) or :class:`~appliance.thermal.fake_pynvml.FakePynvml`.
    """

    name = "nvml"

    def __init__(self, index: int = 0, nvml: ModuleType | Any | None = None) -> None:
        self.index = index
        self._nvml: Any = nvml  # the pynvml module or a FakePynvml; None until _open()
        self._handle: object | None = None
        self._uuid = ""
        self._why = ""
        self._temp_fn = "nvmlDeviceGetTemperatureV"
        self._reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._dropped: set[str] = set()
        self._retry_in: dict[str, int] = {}  # power / energy call -> reads until it is tried again
        self._odd_seen: set[str] = set()  # "call:ExceptionType" already logged
        self._stale_reads = 0  # failed reads in a row of a _STALE kind
        self._open()

    # ----------------------------------------------------------------- setup
    def _open(self) -> None:
        if self._nvml is None:
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
            self._uuid = self._read_uuid()
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                self._why = "no GPU: NVML library not found"
            elif code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
                self._why = "no GPU: NVIDIA driver not loaded"
            else:
                self._why = f"NVML init failed: {exc} (code {code})"
            log.info("NVML unavailable: %s", self._why)

    def _read_uuid(self) -> str:
        try:
            uuid = self._nvml.nvmlDeviceGetUUID(self._handle)
        except Exception:  # noqa: BLE001 - an identity is a nicety: NVMLError, or a binding without the call
            return ""
        return uuid.decode(errors="replace") if isinstance(uuid, bytes) else str(uuid)

    @property
    def identity(self) -> str:
        """The GPU's UUID, else ``nvml:<index>`` (a driver that does not answer for it)."""
        return self._uuid or f"nvml:{self.index}"

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
        if error in _LOST:
            return Reading(None, error=error)
        self._stale_reads = self._stale_reads + 1 if error in _STALE else 0
        if self._stale_reads >= _REOPEN_AFTER:
            self._reopen(error or "")
            return Reading(None, error=error)
        power = self._secondary("nvmlDeviceGetPowerUsage", 1e-3)
        energy = self._secondary("nvmlDeviceGetTotalEnergyConsumption", 1e-3)
        reasons = self._read_reasons()
        if "lost" in self._dropped:
            return Reading(None, error="lost")
        return Reading(temp, power, energy, reasons, error)

    def _reopen(self, why: str) -> None:
        """Initialise NVML again and take the device handle anew (by index, as at start)."""
        self._stale_reads = 0
        nv = self._nvml
        try:
            nv.nvmlInit()
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.index)
        except nv.NVMLError as exc:
            log.warning("NVML reads fail (%s); opening NVML again failed: %s", why, exc)
            return
        log.warning("NVML reads failed %d times in a row (%s); NVML opened again", _REOPEN_AFTER, why)

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
        """Power or energy, or None; a call that says it is unsupported is skipped for a while.

        It is tried again every ``_SECONDARY_RETRY_READS`` reads: one transient NOT_SUPPORTED dropped the measured
        power for the life of the process (held-out review, session 14).
        """
        if self._retry_in.get(fn_name, 0) > 0:
            self._retry_in[fn_name] -= 1
            return None
        nv = self._nvml
        try:
            value = float(getattr(nv, fn_name)(self._handle)) * scale
        except nv.NVMLError as exc:
            kind = nvml_error_kind(exc)
            if kind in _LOST:
                self._dropped.add("lost")
            elif kind in ("not_supported", "function_not_found", "no_permission"):
                if fn_name not in self._retry_in:
                    log.warning("NVML %s: %s; skipped, tried again every %d reads", fn_name, kind,
                                _SECONDARY_RETRY_READS)
                self._retry_in[fn_name] = _SECONDARY_RETRY_READS
            return None
        except Exception as exc:  # noqa: BLE001 - not NVML's own: drop this value, not the temperature read with it
            self._odd(fn_name, exc)
            return None
        if self._retry_in.pop(fn_name, None) is not None:
            log.warning("NVML %s answers again", fn_name)
        return value

    def _odd(self, fn_name: str, exc: Exception) -> None:
        """An exception NVML's binding does not document: its value is dropped, and said once per call and type.

        Raised from a power or clock-reasons call, one made the whole sample a failed read, and a good temperature
        went BLIND with it (held-out review, session 19).
        """
        key = f"{fn_name}:{type(exc).__name__}"
        if key not in self._odd_seen:
            self._odd_seen.add(key)
            log.warning("NVML %s raised %s (not an NVML error); its value is dropped", fn_name, type(exc).__name__)

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
            elif kind in _LOST:
                self._dropped.add("lost")
            elif kind in ("not_supported", "function_not_found", "no_permission"):
                self._dropped.add(self._reasons_fn)
            return None
        except Exception as exc:  # noqa: BLE001 - see _odd
            self._odd(self._reasons_fn, exc)
            return None

    def read_fields(self, field_ids: Sequence[int]) -> dict[int, float | str]:
        """Return field values by id, each decoded by its ``valueType``.

        a field that failed maps to its error kind (``nvmlDeviceGetFieldValues`` only checks the call, so each
        ``nvmlReturn`` is checked here).
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
            if code != pynvml.NVML_SUCCESS:
                out[fid] = NVML_ERRORS.get(code, ("", "read_error", ""))[1]
                continue
            try:
                out[fid] = field_value(entry)
            except ValueError as exc:
                log.warning("%s", exc)
                out[fid] = "unknown_value_type"
        return out

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        if self._handle is not None and self._nvml is not None:
            self._handle = None
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)
