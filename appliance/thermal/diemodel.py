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

#: The window over which the load's swing is taken, s (a few die time constants, about three sensor delays).
SWING_S = 10.0


class DieModel:
    """The die as low-passed power (now, and as the delayed sensor should show it), and the watts behind it."""

    def __init__(self, config: ThermalConfig) -> None:
        c = self.config = config
        self.w_per_duty = c.nameplate_w
        """Watts of a full duty above idle, as learned from measured power and the achieved busy fraction."""
        self.then = 0.0
        """The die model sensor_delay_s ago, W (what the reading should show now)."""
        self._now: float | None = None  # the die model now, W
        self._seed: float | None = None  # where a restart starts it (Governor.resume), W
        self._hist: deque[tuple[float, float]] = deque(maxlen=int(c.sensor_delay_s / c.period_s) + 8)
        self._filtered: tuple[float, float, float] | None = None  # (time, filtered reading, delayed model)
        self._use: float | None = None  # the share of its allowance the load used, low-passed like the die
        self._uses: deque[tuple[float, float]] = deque()  # (time, low-passed use) over SWING_S
        self._use_duty = 1.0  # the duty of the last period noted

    @property
    def now_w(self) -> float | None:
        """The die model now, W (before the first power: the seed, if any)."""
        return self._now if self._now is not None else self._seed

    def seed(self, watts: float) -> None:
        """Start the die model at ``watts``, or the first power if that is higher (a restart on a warm die).

        A first power above the seed says the GPU was not idle while no daemon ran (docs/thermal.md, "Restarts").
        """
        self._seed = watts

    def advance(self, now_s: float, power: float, dt: float) -> None:
        """Take this period's power: the die model is power low-passed with ``die_tau_s``."""
        c = self.config
        if self._now is None:
            self._now = power if self._seed is None else max(self._seed, power)
        else:
            self._now += (power - self._now) * min(dt / c.die_tau_s, 1.0)
        self._hist.append((now_s, self._now))
        self.then = self._delayed()

    def note_use(self, now_s: float, busy: float | None, duty: float, dt: float, *, paced: bool = True) -> None:
        """Take the share of its allowance the load used in the last period: ``busy`` over the ``duty`` it ran at.

        This is the load's own variation, not the PI's: under a steady full load it is 1 whatever the duty. Periods
        the PI did not pace (``paced`` False: cool, blind, holding) start the window again.
        """
        if not paced:
            self._use = None
            self._uses.clear()
            return
        use = 1.0 if busy is None or duty <= 1e-6 else min(max(busy / duty, 0.0), 1.0)
        self._use = use if self._use is None else self._use + (use - self._use) * min(dt / self.config.die_tau_s, 1.0)
        self._uses.append((now_s, self._use))
        self._use_duty = duty
        while self._uses[0][0] < now_s - SWING_S:
            self._uses.popleft()

    def swing_c(self) -> float:
        """How far the die's peaks stand above its mean under the load's own variation, °C (the swing margin).

        The reading, delayed and floored, follows the die's mean; under a load that comes and goes within a few
        seconds the die's peaks stand above it by about what the low-passed use's peak over :data:`SWING_S` stands
        above its mean, as watts at the duty now (docs/thermal.md, "Swing margin").
        """
        if len(self._uses) < 2:
            return 0.0
        uses = [u for _, u in self._uses]
        spread = max(uses) - sum(uses) / len(uses)
        return self.model_c(spread * self._use_duty * self.full_w())

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
