"""Compatibility alias: the code lives in :mod:`appliance.thermal.governor`."""

from appliance.thermal.governor import (
    Decision,
    Governor,
    GovernorState,
    ThermalConfig,
)

__all__ = [
    "Decision",
    "Governor",
    "GovernorState",
    "ThermalConfig",
]
