"""Compatibility alias: the code lives in :mod:`appliance.thermal.commissioning`."""

from appliance.thermal.commissioning import (
    commission,
    measure_latency,
    measure_step_response,
    measure_update_period,
    safe_blind_duty,
    set_static_power_limit,
)

__all__ = [
    "commission",
    "measure_latency",
    "measure_step_response",
    "measure_update_period",
    "safe_blind_duty",
    "set_static_power_limit",
]
