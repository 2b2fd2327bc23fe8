"""The guard: the second line of defence under the PI, on readings at or past ``guard_c`` (docs/thermal.md, "Guard").

Pure: no I/O, no clock. The governor feeds it every regulated reading and asks whether the die is hot, what the
budget may keep while it is, and when a guard that keeps capping has lasted long enough to wind the integrator down.
"""

from __future__ import annotations

import itertools
from collections import deque

from appliance.thermal.params import ThermalConfig

__all__ = ["Guard"]

#: After the guard has capped the budget this long, the integrator is wound down to the cap. Without it, a fan that
#: stopped at full load left the integrator above the cap; when the lead term released the guard at 74 °C on a die
#: still at 75 °C, the duty jumped from 0.11 to 0.48 and the die climbed again: 84 s above 75 °C (held-out review,
#: session 14). Transient guard hits (noise at guard_c) are shorter and keep the integrator, and so the throughput.
WINDUP_S = 3.0

#: Readings in a row at or above guard_c that engage the guard even when the delay compensation says the die is
#: already falling, provided the mean of the last HOT_WINDOW readings is within HOT_MEAN_C of guard_c. The guard acted
#: on the reading plus that compensation only: after a cut the die model's fall released it, but with a stopped fan
#: the warming heatsink holds the die up, and the budget climbed back. With a fan stopping at full load 21 of 33 plants
#: passed 75 °C (up to 16.5 s, 76.75 °C; docs/thermal.md, fan entry). Noise reaches the guard too: one reading raised
#: a noisy sensor's settled peak-to-peak from 0.59 to 1.81 °C, two in a row another's to 1.70 °C at the peaks of its
#: oscillation, where the readings before them were a degree lower; a held die is hot in all of them.
HOT_READINGS = 2
HOT_WINDOW = 4
HOT_MEAN_C = 0.5

#: Guard steps (``guard_factor``) more per degree that the held readings stand above guard_c. A reading past the guard
#: says the die is at the limit or past it; one step of 7 % a second let a die whose fan had stopped climb on for
#: seconds: 31 s above 75 °C (76.5 °C) behind a sensor 2 s laggier than commissioned, 14.5 s (77.7 °C) on a plant at
#: the corner of the rated ranges. Held readings never reach a degree past the guard on the healthy scans, so faults
#: pay for it, and a sensor whose noise wanders slowly past the guard (0.25 % of the served work; docs/thermal.md,
#: "Escalating guard").
STEPS_PER_C = 2.0

#: The steepest rise between readings, °C/s, over which readings past the guard still escalate it. A die that climbs
#: past the guard (a stopped fan: about 1 °C a second on the fastest plants) gets there in steps; a burst of hot
#: glitches jumps there, and answering it with the deep cut cost 2-5 % of the throughput per burst (held-out review,
#: session 21). Readings that jumped still get the plain guard.
CLIMB_C_PER_S = 1.5
#: How far back a jump keeps the escalation off, s (a burst of glitches longer than the hot window still began with
#: a jump).
CLIMB_SPAN_S = 10.0


class Guard:
    """Whether the die is hot, the budget the guard lets it keep, and how long the guard has kept capping."""

    def __init__(self, config: ThermalConfig) -> None:
        self.config = config
        self._span = max(int(CLIMB_SPAN_S / config.period_s), 2)  # readings the climb test looks back over
        self._recent: deque[float] = deque(maxlen=max(HOT_WINDOW, self._span))  # the last regulated readings
        self._past_c = 0.0  # how far past guard_c the held readings stand, °C (0 when not held)
        self._steps = 0.0  # guard steps taken in this run of capped samples (an escalated sample takes several)

    def hot(self, reading: float, ahead_c: float) -> bool:
        """Take this sample's reading; True when the guard acts on it.

        ``ahead_c`` is the hotter of the reading plus the delay compensation and its filtered twin. Readings held at
        the guard are not noise: they make the die hot whatever the models predict.
        """
        c = self.config
        self._recent.append(reading)
        recent = list(self._recent)
        window, last = recent[-HOT_WINDOW:], recent[-HOT_READINGS:]
        held = (len(last) == HOT_READINGS and min(last) >= c.guard_c
                and sum(window) / len(window) >= c.guard_c - HOT_MEAN_C)
        climbed = held and not any(b - a > CLIMB_C_PER_S * c.period_s
                                   for a, b in itertools.pairwise(recent[-self._span:]))
        self._past_c = max(min(last) - c.guard_c, 0.0) if climbed else 0.0
        return ahead_c >= c.guard_c or held

    def cap_w(self, power: float) -> float:
        """The budget the guard lets a hot die keep, W.

        ``guard_factor`` of the power, and a step more for every half degree the held readings stand past ``guard_c``.
        """
        c = self.config
        return float(c.guard_factor ** (1.0 + STEPS_PER_C * self._past_c)) * power

    def capped(self) -> bool:
        """Count a sample the guard capped; True once the run is sustained (wind the integrator down to the cap).

        Sustained means :data:`WINDUP_S` worth of guard steps, an escalated sample counting as the steps it took:
        two seconds of deep cuts released the guard before three samples had passed, so the integrator was never
        wound down and the PI went back to the budget from before the cuts, on a die whose fan had stopped (held-out
        review, session 21: a 4 s limit cycle).
        """
        self._steps += 1.0 + STEPS_PER_C * self._past_c
        return self._steps >= WINDUP_S / self.config.period_s

    def released(self) -> None:
        """A sample the guard did not cap: the run starts again."""
        self._steps = 0.0
