"""Compatibility alias: the code lives in :mod:`appliance.thermal` (``plant``, ``sim``, ``simcli``)."""

from appliance.thermal.plant import PRESETS, Fault, Plant, PlantParams, Sensor, SensorParams
from appliance.thermal.sim import (
    FAULT_KINDS,
    Profile,
    SimResult,
    Targets,
    best_constant_duty,
    day_profile,
    evaluate,
    fault_schedule,
    ideal_tracker,
    peak_to_peak,
    run_profile,
    settling_times,
)
from appliance.thermal.simcli import main

__all__ = [
    "FAULT_KINDS",
    "PRESETS",
    "Fault",
    "Plant",
    "PlantParams",
    "Profile",
    "Sensor",
    "SensorParams",
    "SimResult",
    "Targets",
    "best_constant_duty",
    "day_profile",
    "evaluate",
    "fault_schedule",
    "ideal_tracker",
    "main",
    "peak_to_peak",
    "run_profile",
    "settling_times",
]
