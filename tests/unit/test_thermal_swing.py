"""The swing margin: under a load that comes and goes within seconds, the die's peaks stand above what the readings
show, and the target is lowered by the load's own swing (docs/thermal.md, "Swing margin")."""

from __future__ import annotations

import random

from appliance.thermal import plant as tp
from appliance.thermal.diemodel import DieModel
from appliance.thermal.governor import Governor, ThermalConfig
from appliance.thermal.matrix import matrix_plants


def _on_off(name: str, draw: int, *, warmer_c: float, p_on: float = 0.6, seconds: int = 3600,
            seed: int = 21) -> tuple[float, float, float]:
    """Each second full demand with probability ``p_on``, else none (after 3 idle minutes), in a room ``warmer_c``
    above the plant's (at most the rated 40 °C). Returns seconds above 75 °C, the hottest die and the work done."""
    row = next(r for r in matrix_plants(30, draw) if r.plant.name == name)
    room = min(row.room_c + warmer_c, 40.0)
    rng = random.Random(seed)
    demand = [0.0 if t < 180 else float(rng.random() < p_on) for t in range(seconds)]
    plant = tp.Plant(row.plant, room, max_delay_s=row.sensor.delay_s + 40)
    sensor = tp.Sensor(row.sensor, 1)
    gov = Governor(row.config())
    duty, used, done = 1.0, 0.0, 0.0
    for t in range(seconds):
        duty = gov.update(float(t), sensor.read(plant), None, None if t == 0 else used, energy_j=plant.energy_j)
        used = min(demand[t], duty)
        done += used
        plant.advance(1.0, used)
    return plant.seconds_above, plant.max_tj, done


def test_a_load_that_comes_and_goes_each_second_keeps_the_die_under_the_limit() -> None:
    """Held-out review, session 20: full demand on 60 % of the seconds at random, in a room 8 °C warmer (at most 40 °C):
    the die swung 1-3 °C within one sensor delay and its peaks passed 75 °C on 22 of 160 plants commissioned as an
    operator would (up to 20 s, 75.70 °C); this plant: 7.5 s above, 75.51 °C."""
    above, hottest, _ = _on_off("rand3-4", 3, warmer_c=8.0)
    assert above == 0.0 and hottest < 75.0, (above, hottest)


def test_the_swing_is_the_loads_own_not_the_pi_s() -> None:
    """A steady load has no swing, whatever the duty does (so a steady full load loses nothing); an on/off one has."""
    cfg = ThermalConfig()
    steady, on_off = DieModel(cfg), DieModel(cfg)
    for t in range(60):
        duty = 0.5 + 0.4 * (t % 7) / 7  # the PI moving the duty: fully used each time
        steady.note_use(float(t), duty, duty, 1.0)
        on_off.note_use(float(t), 0.8 if t % 3 else 0.0, 0.8, 1.0)
    assert steady.swing_c() == 0.0
    assert on_off.swing_c() > 0.3
