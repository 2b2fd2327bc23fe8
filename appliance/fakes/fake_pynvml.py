"""Compatibility alias: the fake lives in :mod:`appliance.thermal.fake_pynvml`."""

from appliance.thermal.fake_pynvml import FakePynvml

__all__ = ["FakePynvml"]
