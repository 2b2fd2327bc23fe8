"""The board power the governor's models run on: NVML's energy counter, else its power reading, else the duty.

Pure: no I/O, no clock. One :class:`BoardPower` per governor; docs/thermal.md, "Power from the energy counter"
and "A noisy power reading".
"""

from __future__ import annotations

import math
import statistics
from collections import deque

__all__ = ["BIAS_TAU_S", "ENERGY_STALE_S", "SCATTER_READINGS", "TRUSTED_SCATTER", "BoardPower"]

#: An energy counter that has not moved for this long is not read as "not updated yet": power falls back to NVML's
#: power reading or the duty model (a counter stuck for good must not hold the last rate forever).
ENERGY_STALE_S = 10.0

#: The relative scatter of a power reading around the duty model that is still taken as it comes (1 sigma). A
#: reading scattered more is blended toward the model: it keeps (this / its scatter)² of its own value.
TRUSTED_SCATTER = 0.1

#: Readings whose read-to-read changes measure the scatter (their median: a real step, a power cap switching on,
#: is one change among them and moves it little).
SCATTER_READINGS = 15

#: Time constant of the running bias of the power reading against the duty model, s.
BIAS_TAU_S = 10.0


class BoardPower:
    """Turns what NVML gives each period into the board's power over that period, W.

    ``sample`` returns two figures: the power the models, the lead and the guard act on, and the measured power to
    learn watts per duty from (``None`` when nothing was measured). They differ only for a noisy power reading
    without an energy counter: the first is blended toward the duty model (corrected by the reading's running bias),
    the second is the reading as it came, since learning averages noise out and must not learn its own model back;
    ``trust`` says how much slower to learn from it.
    """

    def __init__(self, p_idle_w: float) -> None:
        self._p_idle_w = p_idle_w
        self._last_energy: tuple[float, float] | None = None  # (time, counter) of the counter's last move
        self._energy_w: float | None = None  # the rate of that move, W
        self._bias = 0.0  # running mean of (reading - model) / model
        self._rel: float | None = None  # the last reading's (reading - model) / model
        self._changes: deque[float] = deque(maxlen=SCATTER_READINGS)  # |read-to-read change| of that
        self.measured = False
        """Whether the last sample's power came from NVML (not the duty model)."""
        self.trust = 1.0
        """How far the last measured power was taken as it came, 0-1 (below 1 for a scattered power reading)."""

    def sample(self, now_s: float, dt: float, power_w: float | None, energy_j: float | None, used: float,
               w_per_duty: float) -> tuple[float, float | None]:
        """The power over the last period for the models, and the measured power for learning, W.

        Args:
            now_s: Monotonic time of this sample, s.
            dt: Seconds since the last sample (bounded by the caller).
            power_w: NVML's power reading, W, if any.
            energy_j: NVML's cumulative energy counter, J, if any (preferred: the exact average over the period).
            used: The busy fraction the engine achieved over the period (or the duty when unknown).
            w_per_duty: The learned watts of a full duty above idle.
        """
        modelled = self._p_idle_w + max(0.0, min(used, 1.0)) * w_per_duty
        energy = self._from_energy(now_s, energy_j)
        self.trust = 1.0
        if energy is not None:
            self.measured = True
            return energy, energy
        if power_w is not None and math.isfinite(power_w) and power_w >= 0:
            self.measured = True
            return self._blend(power_w, modelled, dt), power_w
        self.measured = False
        return modelled, None

    def _from_energy(self, now_s: float, energy_j: float | None) -> float | None:
        """The counter's average power since its last move; None without a usable counter.

        A counter that did not move since the last read has not been updated yet (a GPU never draws 0 W): its last
        rate stands, and the next move is spread over the whole time since the one before. Taken read by read, a
        counter that updates every 3 s gave 0, 0 and 3P; the zeros were dropped from learning and the 3P kept, so
        the learned watts per duty came out 2.6-2.9 times too high, the die models shrank by that factor and a
        frozen sensor was caught 380 s late, the die at 75-77 °C meanwhile (held-out review, session 18).
        """
        if energy_j is None or not math.isfinite(energy_j):
            return None
        last = self._last_energy
        if last is None or energy_j < last[1]:  # the first read, or the counter was reset
            self._last_energy = (now_s, energy_j)
            return None
        if energy_j > last[1] and now_s > last[0]:
            self._energy_w = (energy_j - last[1]) / (now_s - last[0])
            self._last_energy = (now_s, energy_j)
            return self._energy_w
        if now_s - last[0] <= ENERGY_STALE_S:  # not updated yet: its last rate stands
            return self._energy_w
        return None

    def _blend(self, reading: float, modelled: float, dt: float) -> float:
        """A power reading, blended toward the duty model as far as it scatters around it.

        The duty model knows each change of the engine's busy fraction at once and exactly; the reading also sees
        what the model cannot (a power cap, a heavier workload), which its running bias carries. A reading with
        ±30 % noise taken as it came drove the delay compensation ±1 °C read to read: low samples at full duty
        said the die was cooling while it rose past 75 °C (2 of 96 plants, held-out review, session 18).
        """
        rel = (reading - modelled) / max(modelled, 1.0)
        if self._rel is not None:
            self._changes.append(abs(rel - self._rel))
        self._rel = rel
        # the median |change| of independent noise of sigma s is 0.954 s (a normal difference has sigma s·√2)
        scatter = statistics.median(self._changes) / 0.954 if len(self._changes) >= 3 else 0.0
        expected = modelled * (1.0 + self._bias)
        self.trust = min(1.0, (TRUSTED_SCATTER / scatter) ** 2) if scatter > 0.0 else 1.0
        self._bias += (rel - self._bias) * min(dt / BIAS_TAU_S, 1.0)
        return reading - (1.0 - self.trust) * (reading - expected)  # exactly the reading at a trust of 1
