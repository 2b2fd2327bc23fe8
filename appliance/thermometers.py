"""Compatibility alias: the code lives in :mod:`appliance.thermal` (``source``, ``nvml``, ``simulated``)."""

from appliance.thermal.nvml import NVML_ERRORS, NvmlThermometer, nvml_error_kind
from appliance.thermal.simulated import SimulatedThermometer
from appliance.thermal.source import NoThermometer, Reading, Thermometer, make_thermometer

__all__ = [
    "NVML_ERRORS",
    "NoThermometer",
    "NvmlThermometer",
    "Reading",
    "SimulatedThermometer",
    "Thermometer",
    "make_thermometer",
    "nvml_error_kind",
]
