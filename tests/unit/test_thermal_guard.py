"""The guard under the PI (docs/thermal.md, "Guard" and "Escalating guard"): readings past guard_c cut deeper, but only
when the die climbed there, and deep cuts count toward winding the integrator down."""

from __future__ import annotations

import pytest

from appliance.thermal.guard import CLIMB_SPAN_S, Guard
from appliance.thermal.params import ThermalConfig

CFG = ThermalConfig()  # guard_c 74 °C, guard_factor 0.93, one sample a second


def _fed(readings: list[float]) -> tuple[Guard, bool]:
    guard = Guard(CFG)
    hot = False
    for reading in readings:
        hot = guard.hot(reading, reading)
    return guard, hot


def test_readings_that_climb_past_the_guard_cut_two_steps_more_per_degree() -> None:
    guard, hot = _fed([72.0, 73.0, 74.0, 75.0, 76.0])
    assert hot
    assert guard.cap_w(100.0) == pytest.approx(100.0 * 0.93 ** 3)  # held at 75 and 76: one degree past
    guard, _ = _fed([72.0, 73.0, 74.0, 75.0, 76.0, 76.0])
    assert guard.cap_w(100.0) == pytest.approx(100.0 * 0.93 ** 5)
    guard, hot = _fed([72.0, 73.0, 74.0, 74.0])  # at the guard, not past it: the plain step
    assert hot and guard.cap_w(100.0) == pytest.approx(93.0)


def test_readings_that_jumped_past_the_guard_get_the_plain_step() -> None:
    """Held-out review, session 21: a burst of hot glitches (+3 to +6 °C for 4-5 readings, under the 10 °C/s jump
    test) won the vote and was cut like a die past the limit, 30-50 % a second: 2-5 % less served per burst, and false
    HOLDING and BLIND verdicts as the die fell under the glitches. A die climbs past the guard; glitches jump there."""
    guard, hot = _fed([73.0, 73.0, 73.0, 79.0, 79.0, 79.0, 79.0, 79.0])
    assert hot and guard.cap_w(100.0) == pytest.approx(93.0)
    # readings that stay there longer than the climb test looks back are the die's: the guard escalates again
    guard, _ = _fed([73.0, 73.0, 79.0] + [79.0] * int(CLIMB_SPAN_S))
    assert guard.cap_w(100.0) < 0.93 ** 10 * 100.0 + 1e-9


def test_a_plain_guard_winds_the_integrator_down_after_three_samples() -> None:
    guard, _ = _fed([73.0, 74.0, 74.0, 74.0])
    assert guard.cap_w(86.0) == pytest.approx(0.93 * 86.0)  # what the integrator is wound down to
    assert [guard.capped() for _ in range(3)] == [False, False, True]
    guard.released()
    assert not guard.capped()  # a new run counts again


def test_deep_cuts_count_toward_winding_the_integrator_down() -> None:
    """Held-out review, session 21: two seconds of deep cuts let the readings fall under the guard before three samples
    had passed, so the integrator was never wound down and the PI went back to the budget from before the cuts: on a
    fast die whose fan had stopped, a 4 s limit cycle (0 -> 11 s above 75 °C). An escalated sample now counts as the
    guard steps it took."""
    guard, _ = _fed([72.0, 73.0, 74.0, 75.0, 76.0])
    assert guard.capped()  # three steps at once: wound down now, to the escalated cap
    assert guard.cap_w(100.0) == pytest.approx(100.0 * 0.93 ** 3)
