"""The live boost: how far above ``setpoint_c`` the PI's target may rise while the reading is demonstrably live.

Pure: no I/O, no clock. One :class:`LiveBoost` per governor (docs/thermal.md, "Live boost").
"""

from __future__ import annotations

from appliance.thermal.params import ThermalConfig

__all__ = ["LiveBoost"]


class LiveBoost:
    """Grows while the reading is live and settled; withdrawn on any sign of a fault; shrunk by guard hits."""

    def __init__(self, config: ThermalConfig) -> None:
        self.config = config
        self.value = 0.0
        """The boost now added to ``setpoint_c``, °C."""
        self._smooth: float | None = None  # the regulated reading, low-passed over 10 s (the settle test)
        self._hits = 0.0  # the share of readings at or above guard_c, 5 min mean

    def withdraw(self) -> None:
        """A fault path (read errors past ``hold_s``, a stuck verdict, BLIND): back to the commissioned margin."""
        self.value = 0.0

    def update(self, filtered: float, reading: float, unseen: float, dt: float, *, may_raise: bool) -> float:
        """Take one regulated sample and return the boost for it.

        ``filtered`` is the reading the P term acts on (with the lead), ``reading`` the raw one, ``unseen`` the rise
        the die model made that a stalled reading does not show, and ``may_raise`` whether the frozen-sensor check
        allows a budget raise with no probe running.
        """
        c = self.config
        self._smooth = (filtered if self._smooth is None
                        else self._smooth + (filtered - self._smooth) * min(dt / 10.0, 1.0))
        target = c.setpoint_c + self.value
        # how often the readings reach the guard (5 min mean): the boost shrinks to 0 as that nears boost_hit_rate
        self._hits += ((1.0 if reading >= c.guard_c else 0.0) - self._hits) * min(dt / 300.0, 1.0)
        ceiling = c.live_boost_c * max(1.0 - self._hits / c.boost_hit_rate, 0.0)
        step = c.boost_rate_c_per_s * dt
        if unseen > 0.0:
            self.value = 0.0
        elif self._smooth >= target + 0.75:
            self.value = max(self.value - 5.0 * step, 0.0)
        elif self.value > ceiling:
            self.value = max(self.value - step, ceiling)
        elif may_raise and target - 1.0 <= self._smooth <= target + 0.25:
            self.value = min(self.value + step, ceiling)
        return self.value
