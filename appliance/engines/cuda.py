"""The CUDA runtime seam: cuda-python's ``cuda.bindings.runtime`` (or its fake), probes and device facts.

Every call of the real binding returns a tuple whose first item is a ``cudaError_t``; :func:`check` turns a
non-success into :class:`CudaError` naming the call and the error (``cudaErrorInsufficientDriver``, ...).
:func:`probe_device` answers "can CUDA run here, and on what?" by actually asking the runtime
(``cudaGetDeviceCount``), so "no driver", "no GPU" and "cuda-bindings missing" each get their own reason.

Tests pass ``appliance.engines.fake_cudart`` wherever a ``cudart`` argument is taken; its functions have the
real binding's signatures (tests/gpu/test_gpu_fakes_conformance.py checks them with :mod:`inspect`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from appliance.errors import EngineError

__all__ = ["CudaError", "DeviceInfo", "check", "import_cudart", "probe_device"]


class CudaError(EngineError):
    """A CUDA runtime call failed; ``cuda_error`` is the error's name, e.g. ``cudaErrorInsufficientDriver``.

    ``code`` stays the gRPC status code of :class:`~appliance.errors.EngineError` (INTERNAL): the server maps it.
    """

    def __init__(self, call: str, code: str) -> None:
        super().__init__(f"{call} failed: {code}")
        self.call, self.cuda_error = call, code


def import_cudart() -> Any:
    """Return ``cuda.bindings.runtime`` (raises ImportError naming the ``cuda-bindings`` distribution)."""
    try:
        from cuda.bindings import runtime
    except ImportError as e:
        raise ImportError(f"cuda-bindings is not installed (the [gpu] extra): {e}") from e
    return runtime


def _name(cudart: Any, err: Any) -> str:
    name = getattr(err, "name", None)
    if isinstance(name, str):
        return name
    try:
        _, text = cudart.cudaGetErrorName(err)
        return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - naming the error must never hide it
        return str(err)


def check(cudart: Any, call: str, result: Any) -> Any:
    """Unpack ``(err, *values)`` from a cuda.bindings call: raise :class:`CudaError` unless success.

    Returns None, the single value, or the tuple of values.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise CudaError(call, _name(cudart, err))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class DeviceInfo:
    """What the CUDA runtime reports about device 0 (None fields: not available here)."""

    ok: bool  # a usable CUDA device exists
    reason: str | None  # why not, in words naming the missing driver/device/package
    driver_version: int | None = None  # e.g. 13050 for CUDA 13.5 (0: no driver)
    runtime_version: int | None = None
    device_count: int = 0
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    total_memory_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (for ``doctor --gpu --json``)."""
        return asdict(self)


def probe_device(cudart: Any | None = None) -> DeviceInfo:
    """Ask the CUDA runtime for device 0; never raises.

    Args:
        cudart: the runtime module (default: the real ``cuda.bindings.runtime``).
    """
    if cudart is None:
        try:
            cudart = import_cudart()
        except ImportError as e:
            return DeviceInfo(False, str(e))
    success = cudart.cudaError_t.cudaSuccess
    err, runtime_version = cudart.cudaRuntimeGetVersion()
    runtime_version = runtime_version if err == success else None
    err, driver_version = cudart.cudaDriverGetVersion()
    driver_version = driver_version if err == success else None
    err, count = cudart.cudaGetDeviceCount()
    if err != success:
        code = _name(cudart, err)
        if code == "cudaErrorInsufficientDriver":
            why = ("no NVIDIA driver: cudaGetDeviceCount -> cudaErrorInsufficientDriver (libcuda.so.1 missing "
                   f"or older than the CUDA runtime {runtime_version})")
        elif code == "cudaErrorNoDevice":
            why = "no CUDA GPU: the NVIDIA driver is loaded but cudaGetDeviceCount -> cudaErrorNoDevice"
        else:
            why = f"CUDA unusable: cudaGetDeviceCount -> {code}"
        return DeviceInfo(False, why, driver_version, runtime_version)
    if count == 0:
        return DeviceInfo(False, "no CUDA GPU: cudaGetDeviceCount returned 0", driver_version, runtime_version)
    err, prop = cudart.cudaGetDeviceProperties(0)
    if err != success:
        return DeviceInfo(False, f"cudaGetDeviceProperties(0) -> {_name(cudart, err)}", driver_version,
                          runtime_version, count)
    name = prop.name.split(b"\0", 1)[0].decode() if isinstance(prop.name, bytes) else str(prop.name)
    return DeviceInfo(True, None, driver_version, runtime_version, count, name, (int(prop.major), int(prop.minor)),
                      int(prop.totalGlobalMem))
