"""The board power the governor's models run on (appliance/thermal/boardpower.py), alone and in the loop."""

from __future__ import annotations

import random
import statistics

import pytest

from appliance.thermal.boardpower import BoardPower

IDLE_W, FULL_W = 60.0, 400.0  # idle, and watts of a full duty above idle


def feed(board: BoardPower, readings: list[float], used: float = 1.0, t0: float = 0.0) -> list[float]:
    return [board.sample(t0 + i, 1.0, w, None, used, FULL_W)[0] for i, w in enumerate(readings)]


def test_a_clean_reading_is_taken_exactly_as_it_comes_even_through_a_step() -> None:
    board = BoardPower(IDLE_W)
    readings = [460.0 + (i % 3) for i in range(60)] + [280.0] * 30  # a power cap the duty model knows nothing of
    assert feed(board, readings) == readings
    assert board.trust == 1.0 and board.measured


def test_a_noisy_reading_is_blended_toward_the_duty_model_and_learned_from_as_it_came() -> None:
    rng = random.Random(8)
    board = BoardPower(IDLE_W)
    true_w = IDLE_W + FULL_W
    readings = [true_w * (1 + rng.gauss(0, 0.3)) for _ in range(600)]
    got = [board.sample(float(i), 1.0, w, None, 1.0, FULL_W) for i, w in enumerate(readings)]
    models = [g[0] for g in got[30:]]
    assert [g[1] for g in got] == readings  # the measured power for learning is the reading itself
    assert statistics.pstdev(models) < 0.35 * statistics.pstdev(readings[30:])
    assert statistics.fmean(models) == pytest.approx(true_w, rel=0.05)
    assert board.trust < 0.3


def test_a_noisy_reading_still_follows_a_step_the_duty_model_cannot_see() -> None:
    rng = random.Random(3)
    board = BoardPower(IDLE_W)
    capped = 0.6 * (IDLE_W + FULL_W)
    before = [(IDLE_W + FULL_W) * (1 + rng.gauss(0, 0.3)) for _ in range(120)]
    after = [capped * (1 + rng.gauss(0, 0.3)) for _ in range(90)]
    got = feed(board, before + after)
    assert statistics.fmean(got[-40:]) == pytest.approx(capped, rel=0.1)


def test_the_energy_counter_wins_and_no_reading_falls_back_to_the_duty_model() -> None:
    board = BoardPower(IDLE_W)
    assert board.sample(0.0, 1.0, 300.0, 1000.0, 0.5, FULL_W) == (300.0, 300.0)  # the counter's first read
    assert board.sample(1.0, 1.0, 300.0, 1250.0, 0.5, FULL_W) == (250.0, 250.0)
    assert board.sample(2.0, 1.0, float("nan"), None, 0.5, FULL_W) == (IDLE_W + 0.5 * FULL_W, None)
    assert not board.measured


def _noisy_power_run(name: str, seed: int, sigma: float, seconds: int = 900) -> tuple[float, float, float, float]:
    """Full load after 3 idle minutes; no energy counter, NVML's power reading carries relative noise ``sigma``.
    Returns seconds above 75 °C, the hottest die, the learned watts per full duty and the true watts."""
    from appliance.thermal import plant as tp
    from appliance.thermal.governor import Governor
    from appliance.thermal.matrix import matrix_plants

    row = next(r for r in matrix_plants(30, seed) if r.plant.name == name)
    plant = tp.Plant(row.plant, row.room_c, max_delay_s=row.sensor.delay_s + 5)
    sensor = tp.Sensor(row.sensor, 1)
    rng = random.Random(8)
    gov = Governor(row.config())
    used, energy = 0.0, 0.0
    for t in range(seconds):
        power = None if t == 0 else max(0.0, (plant.energy_j - energy) * (1 + rng.gauss(0, sigma)))
        energy = plant.energy_j
        duty = gov.update(float(t), sensor.read(plant), power, None if t == 0 else used)
        used = min(0.0 if t < 180 else 1.0, duty)
        plant.advance(1.0, used)
    return plant.seconds_above, plant.max_tj, gov._die.full_w(), row.plant.p_max_w - row.plant.p_idle_w


@pytest.mark.parametrize(("name", "seed", "sigma"), [("rand3-4", 3, 0.3), ("rand7-16", 7, 0.5), ("rand3-17", 3, 0.5)])
def test_a_noisy_power_reading_keeps_the_die_below_the_limit(name: str, seed: int, sigma: float) -> None:
    """Held-out review, session 18: NVML power with ±30 % noise and no energy counter, taken as it came, swung the
    delay compensation ±1 °C read to read and walked the learned watts ±10 %; the die rose past 75 °C under low
    samples read as cooling (here 5 s at 75.53 °C; with ±50 % noise 2.0 and 1.0 s on the other two plants)."""
    above, hottest, learned, true_w = _noisy_power_run(name, seed, sigma)
    assert above == 0.0 and hottest < 75.0
    assert learned == pytest.approx(true_w, rel=0.15)
