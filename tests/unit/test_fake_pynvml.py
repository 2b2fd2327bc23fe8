"""The fake pynvml against the installed nvidia-ml-py: names, signatures, constants, errors, field unions."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pynvml
import pytest

from appliance.thermal.fake_pynvml import FakePynvml
from appliance.thermal.nvml import NVML_ERRORS, NvmlThermometer, field_value

FAKE_FUNCTIONS = sorted(n for n in dir(FakePynvml) if n.startswith("nvml") and callable(getattr(FakePynvml, n)))


def test_fake_covers_what_the_code_calls() -> None:
    called = {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
              "nvmlSystemGetDriverVersion", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature",
              "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
              "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
              "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerManagementLimit",
              "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceSetPowerManagementLimit"}
    assert called <= set(FAKE_FUNCTIONS)


@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_every_fake_function_has_the_real_signature(name: str) -> None:
    assert hasattr(pynvml, name), f"pynvml has no {name}"
    fake = inspect.signature(getattr(FakePynvml(), name))  # bound: no self
    real = inspect.signature(getattr(pynvml, name))
    as_tuple = [(p.name, p.kind, p.default) for p in real.parameters.values()]
    assert [(p.name, p.kind, p.default) for p in fake.parameters.values()] == as_tuple


def test_constants_and_error_classes_are_pynvml_s_own() -> None:
    nv = FakePynvml()
    copied = [n for n in dir(nv) if n.startswith(("NVML_", "NVMLError"))]
    assert len(copied) > 100
    for name in copied:
        assert getattr(nv, name) is getattr(pynvml, name), name
    for name in ("NVML_ERROR_GPU_IS_LOST", "NVML_VALUE_TYPE_UNSIGNED_SHORT", "NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT",
                 "NVMLError_GpuIsLost", "NVMLError_NotSupported"):
        assert hasattr(nv, name)


@pytest.mark.parametrize(("code", "cls"), [
    (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVMLError_GpuIsLost),
    (pynvml.NVML_ERROR_TIMEOUT, pynvml.NVMLError_Timeout),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVMLError_NotSupported),
])
def test_fake_raises_the_real_subclasses(code: int, cls: type) -> None:
    nv = FakePynvml()
    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    nv.fail["nvmlDeviceGetTemperatureV"] = code
    with pytest.raises(cls) as e:
        nv.nvmlDeviceGetTemperatureV(handle, nv.NVML_TEMPERATURE_GPU)
    assert e.value.value == code and isinstance(e.value, pynvml.NVMLError)


def test_uninitialised_calls_raise_like_pynvml() -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakePynvml().nvmlDeviceGetCount()


VALUES = [
    (pynvml.NVML_VALUE_TYPE_DOUBLE, 91.5), (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 90),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, 7), (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2**40),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, -3), (pynvml.NVML_VALUE_TYPE_SIGNED_INT, -5),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, 65535),
]


@pytest.mark.parametrize(("value_type", "value"), VALUES)
def test_field_values_fill_only_the_named_union_member(value_type: int, value: float) -> None:
    nv = FakePynvml()
    nv.nvmlInit()
    nv.fields[194] = (value_type, value)
    (entry,) = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(0), [194])
    assert isinstance(entry, pynvml.c_nvmlFieldValue_t)
    assert entry.valueType == value_type and entry.nvmlReturn == pynvml.NVML_SUCCESS and entry.fieldId == 194
    assert field_value(entry) == float(value)


def test_reading_the_wrong_union_member_is_garbage() -> None:
    """The bug the valueType decoding fixes: an unsigned 90 read as dVal is ~4.4e-322, not 0, not 90."""
    nv = FakePynvml()
    nv.nvmlInit()
    (entry,) = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(0),
                                           [pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT])
    assert entry.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert 0.0 < entry.value.dVal < 1e-300
    assert field_value(entry) == 91.0


def test_thermometer_reads_mixed_value_types_and_per_field_errors() -> None:
    nv = FakePynvml()
    nv.fields[193] = (pynvml.NVML_VALUE_TYPE_SIGNED_INT, -5)
    nv.fields[194] = (pynvml.NVML_VALUE_TYPE_DOUBLE, 91.25)
    nv.fields[195] = (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 95)
    nv.field_errors[196] = pynvml.NVML_ERROR_GPU_IS_LOST
    out = NvmlThermometer(nvml=nv).read_fields([193, 194, 195, 196, 999])
    assert out == {193: -5.0, 194: 91.25, 195: 95.0, 196: "lost", 999: "not_supported"}


def test_unknown_value_type_is_reported_not_misread() -> None:
    nv = FakePynvml()
    therm = NvmlThermometer(nvml=nv)
    entry = pynvml.c_nvmlFieldValue_t()
    entry.fieldId, entry.valueType = 194, pynvml.NVML_VALUE_TYPE_COUNT
    with pytest.raises(ValueError, match="valueType"):
        field_value(entry)
    nv.fields[194] = (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 91)
    assert therm.read_fields([194]) == {194: 91.0}


def test_error_table_uses_pynvml_constants() -> None:
    assert NVML_ERRORS[pynvml.NVML_ERROR_GPU_IS_LOST][:2] == ("NVMLError_GpuIsLost", "lost")
    for code, (cls_name, _, _) in NVML_ERRORS.items():
        assert pynvml.nvmlExceptionClass(code).__name__ == cls_name


def test_nvml_module_does_not_import_the_simulator() -> None:
    code = ("import sys, appliance.thermal.nvml, appliance.thermal.control, appliance.thermal.source;"
            "bad = [m for m in sys.modules if m.startswith(('appliance.thermal.sim', 'appliance.thermal.plant',"
            " 'appliance.thermal.matrix', 'matplotlib'))]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_old_import_paths_still_work() -> None:
    from appliance.commissioning import commission
    from appliance.fakes.fake_pynvml import FakePynvml as Old
    from appliance.governor import Governor, ThermalConfig
    from appliance.thermal_control import ThermalController
    from appliance.thermal_sim import main
    from appliance.thermometers import make_thermometer

    assert Old is FakePynvml and callable(commission) and callable(main) and callable(make_thermometer)
    assert ThermalController.__module__ == "appliance.thermal.control"
    assert Governor(ThermalConfig()).update(0.0, 50.0, power_w=None, busy=None) == 1.0


@pytest.mark.parametrize("call", ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                                  "nvmlDeviceGetCurrentClocksEventReasons"])
def test_an_exception_that_is_not_nvmls_drops_that_value_only(call: str, caplog) -> None:
    """Held-out review, session 19: an OSError from the power call made the whole sample a failed read, and the
    governor went BLIND with a good 65 °C reading."""
    nv = FakePynvml(temperature=65)
    therm = NvmlThermometer(0, nv)

    def broken(handle: object) -> int:
        raise OSError("driver ioctl failed")

    setattr(nv, call, broken)
    with caplog.at_level("WARNING"):
        first, second = therm.read(), therm.read()
    for reading in (first, second):
        assert reading.error is None and reading.temp_c == 65.0
    field = {"nvmlDeviceGetPowerUsage": "power_w", "nvmlDeviceGetTotalEnergyConsumption": "energy_j",
             "nvmlDeviceGetCurrentClocksEventReasons": "clock_reasons"}[call]
    assert getattr(first, field) is None
    assert caplog.text.count(f"NVML {call} raised OSError (not an NVML error)") == 1  # said once


@pytest.mark.parametrize("how", ["shut down by another user", "stale handle"])
def test_nvml_is_opened_again_after_reads_fail_as_uninitialised_or_with_a_stale_handle(how: str) -> None:
    """Held-out review, session 19: after something else in the process shut NVML down (UNINITIALIZED), or with a
    handle gone stale (INVALID_ARGUMENT), every read failed for good: BLIND at the blind duty for the life of the
    process, though NVML would have answered again."""
    nv = FakePynvml(temperature=61)
    therm = NvmlThermometer(0, nv)
    assert therm.read().temp_c == 61.0
    if how == "shut down by another user":
        nv.nvmlShutdown()
    else:
        nv.fail_once["nvmlDeviceGetTemperatureV"] = pynvml.NVML_ERROR_INVALID_ARGUMENT
        nv.fail["nvmlDeviceGetTemperatureV"] = pynvml.NVML_ERROR_INVALID_ARGUMENT
    errors = [therm.read().error for _ in range(3)]
    assert errors[0] in ("uninitialized", "stale_handle") and len(set(errors)) == 1
    nv.fail.clear()
    assert nv.calls.count("nvmlInit") == 2  # opened again after the third failed read
    assert therm.read().temp_c == 61.0
