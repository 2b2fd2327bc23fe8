"""What the power says the die does: the learned watts per duty, the die model, the delay compensation, the filter.

Pure: no I/O, no clock. One :class:`DieModel` per governor (docs/thermal.md, "Delay compensation" and "A noisy power
reading").
"""

from __future__ import annotations

import itertools
from collections import deque

from appliance.thermal.params import ThermalConfig

__all__ = ["LEARN_RATE", "DieModel"]

#: How far each power sample moves the learned watts per duty (a 20-sample memory).
LEARN_RATE = 0.05


class DieModel:
    """The die as low-passed power (now, and as the delayed sensor should show it), and the watts behind it."""

    def __init__(self, config: ThermalConfig) -> None:
        c = self.config = config
        self.w_per_duty = c.nameplate_w
        """Watts of a full duty above idle, as learned from measured power and the achieved busy fraction."""
        self.then = 0.0
        """The die model sensor_delay_s ago, W (what the reading should show now)."""
        self._now: float | None = None  # the die model now, W
        self._hist: deque[tuple[float, float]] = deque(maxlen=int(c.sensor_delay_s / c.period_s) + 8)
        self._filtered: tuple[float, float, float] | None = None  # (time, filtered reading, delayed model)

    def advance(self, now_s: float, power: float, dt: float) -> None:
        """Take this period's power: the die model is power low-passed with ``die_tau_s``."""
        c = self.config
        if self._now is None:
            self._now = power
        else:
            self._now += (power - self._now) * min(dt / c.die_tau_s, 1.0)
        self._hist.append((now_s, self._now))
        self.then = self._delayed()

    def learn(self, power: float, busy: float, trust: float) -> None:
        """Learn the watts per duty from a measured power and the busy fraction it was drawn at.

        A scattered power reading (``trust`` < 1, :class:`~appliance.thermal.boardpower.BoardPower`) is learned from
        more slowly: at the full rate, ±30 % noise walked the learned watts ±10 % within 20 s, and the delay
        compensation with them (docs/thermal.md, "A noisy power reading").
        """
        if busy >= 0.3:
            sample = (power - self.config.p_idle_w) / busy
            if sample > 0.1 * self.config.p_max_w:
                self.w_per_duty += LEARN_RATE * max(trust, 0.1) * (sample - self.w_per_duty)

    def model_c(self, delta_w: float) -> float:
        """A change of the die model, W, as °C at the learned full power."""
        return self.config.die_rise_c * delta_w / self.full_w()

    def full_w(self) -> float:
        """Watts of a full duty above idle, as learned (bounded to 0.25-2x the nameplate).

        The die models use it so they follow the card that is really there when ``p_max_w`` is the uncommissioned
        default (``die_rise_c`` and ``sink_rise_c`` are rises at full power).
        """
        nameplate = self.config.nameplate_w
        return min(max(self.w_per_duty, 0.25 * nameplate), 2.0 * nameplate)

    def _delayed(self) -> float:
        """The die model (low-passed power, W) as it was sensor_delay_s ago: what the reading should show now."""
        then = self._hist[-1][0] - self.config.sensor_delay_s
        past = self._hist[0][1]
        for (t0, m0), (t1, m1) in itertools.pairwise(self._hist):
            if t0 <= then <= t1:
                past = m0 + (m1 - m0) * ((then - t0) / (t1 - t0) if t1 > t0 else 1.0)
                break
        return past

    def lead_c(self) -> float:
        """What the die model says the die did over the last sensor delay, °C (the delay compensation)."""
        c = self.config
        if self._now is None or c.lead_gain <= 0.0 or c.sensor_delay_s <= 0.0:
            return 0.0
        return c.lead_gain * self.model_c(self._now - self.then)

    def filter(self, now_s: float, reading: float, dt: float) -> float:
        """The reading for the P term: noise-filtered, but following the die model between readings.

        A complementary filter: the model's delayed change since the last sample is added first (a power step
        moves it at once), then the new reading is blended in with ``dt / reading_filter_s``. Restarted from the
        raw reading after any gap in regulation (BLIND, HOLDING, COOL).
        """
        c = self.config
        model = self.then
        last = self._filtered
        if c.reading_filter_s <= 0.0 or last is None or now_s - last[0] > 2.0 * c.period_s:
            value = reading
        else:
            value = last[1] + self.model_c(model - last[2])
            value += (reading - value) * min(dt / c.reading_filter_s, 1.0)
        self._filtered = (now_s, value, model)
        return value
