"""Compatibility alias: the code lives in :mod:`appliance.thermal.control`."""

from appliance.thermal.control import (
    HealthAction,
    ThermalController,
    ThermalStatus,
    health_action,
)

__all__ = [
    "HealthAction",
    "ThermalController",
    "ThermalStatus",
    "health_action",
]
