"""The fault matrix on randomised plants (CI-sized here; the full matrix is marked slow), and the CLI."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from appliance.thermal import matrix as mx
from appliance.thermal.params import GovernorState, ThermalConfig
from appliance.thermal.plant import PLANT_RANGES, PRESETS, SENSOR_RANGES, random_plant, random_sensor, steady_die_c
from appliance.thermal.sim import run_profile
from appliance.thermal.simcli import main


def test_random_plants_stay_within_their_documented_ranges() -> None:
    rng = random.Random(3)
    for _ in range(200):
        p = random_plant(rng)
        s = random_sensor(rng)
        lo, hi = PLANT_RANGES["p_max_w"]
        assert lo <= p.p_max_w <= hi
        lo, hi = PLANT_RANGES["die_rise_c"]
        assert lo - 1e-6 <= p.r_jh * p.p_max_w <= hi + 1e-6
        lo, hi = PLANT_RANGES["tau_die_s"]
        assert lo - 1e-6 <= p.r_jh * p.c_j <= hi + 1e-6
        assert SENSOR_RANGES["delay_s"][0] - 0.01 <= s.delay_s <= SENSOR_RANGES["delay_s"][1] + 0.01
        assert s.quantize in ("floor", "round") and 0.0 <= s.noise_c <= 0.5
        assert 60.0 < steady_die_c(p, 1.0, 25.0) < 90.0
    assert matrix_names(3) == matrix_names(3)  # reproducible by seed


def matrix_names(n: int) -> list[tuple[str, float]]:
    return [(r.plant.name, r.plant.p_max_w) for r in mx.matrix_plants(n, seed=11)]


def test_blind_duty_is_safe_in_the_rated_worst_room() -> None:
    for row in mx.matrix_plants(4, seed=5):
        assert steady_die_c(row.plant, row.blind_duty, row.room_c + 9.0, 0.8) <= 72.0


@pytest.fixture(scope="module")
def ci_cells() -> list[mx.Cell]:
    # the two named plants that failed before, and two random ones; 1.5 h profiles
    return mx.run_matrix(mx.matrix_plants(2, seed=23), mx.FAULTS, hours=1.5, seed=2)


def test_ci_matrix_never_crosses_the_wall(ci_cells: list[mx.Cell]) -> None:
    assert len(ci_cells) == 4 * len(mx.FAULTS)
    for c in ci_cells:
        assert c.seconds_above == 0.0 and c.max_die_c < 75.0, c


def test_ci_matrix_detects_every_fault_and_never_false_blinds(ci_cells: list[mx.Cell]) -> None:
    for c in ci_cells:
        assert c.false_blind_episodes == 0, c
        if c.fault not in ("none", "flaky"):
            assert c.detection_s is not None, c
        if c.fault == "stuck_onset":
            assert c.detection_s <= 10, c  # the load step under a frozen reading
        if c.fault == "stuck_plausible":
            assert c.detection_s <= 300, c
        if c.fault == "lost":
            assert c.detection_s == 0.0 and c.passed, c


def test_ci_matrix_tracking_on_healthy_and_flaky_sensors(ci_cells: list[mx.Cell]) -> None:
    for c in ci_cells:
        if c.fault in ("none", "flaky"):
            assert c.peak_to_peak_c is None or c.peak_to_peak_c <= 1.5, c
            assert c.ratio_ideal >= 0.90, c  # the issue's goal, on every healthy or flaky cell


def test_named_plants_reproduce_the_issue_s_cards() -> None:
    heavy, compact = mx.matrix_plants(0)
    assert heavy.plant.p_max_w == 600.0 and heavy.sensor.delay_s == 2.5
    assert heavy.plant.c_h == pytest.approx(PRESETS["5090"].c_h * 2.5)
    assert compact.plant.p_max_w == 420.0 and compact.sensor == mx.SensorParams(3.0, "floor", 0.25)


def test_cli_matrix_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "m.json", tmp_path / "m.png"
    rc = main(["--matrix", "--plants", "1", "--hours", "1", "--faults", "none,stuck_plausible,lost",
               "--json", str(js), "--plot", str(png)])
    out = capsys.readouterr().out
    doc = json.loads(js.read_text())
    assert doc["command"].startswith("appliance thermal-sim --matrix")
    assert len(doc["cells"]) == 3 * 3 and len(doc["plants"]) == 3
    assert {"seconds_above", "ratio_ideal", "peak_to_peak_c", "detection_s", "false_blind_episodes"} <= set(
        doc["cells"][0])
    assert doc["summary"]["max_seconds_above"] == 0.0
    assert png.stat().st_size > 5000
    assert ("PASS" in out) == (rc == 0)


def test_cli_matrix_rejects_unknown_fault(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--matrix", "--faults", "none,melted"]) == 2
    assert "melted" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(("plant_seed", "seed", "false_blind", "served_floor"), [
    (7, 1, 1, 0.889), (11, 2, 0, 0.886), (3, 5, 1, 0.890), (19, 4, 0, 0.886), (23, 24, 2, 0.884), (29, 30, 0, 0.883),
    (41, 42, 0, 0.886), (43, 44, 0, 0.881), (47, 48, 1, 0.885), (53, 54, 0, 0.885),
])
def test_full_matrix_30_random_plants(plant_seed: int, seed: int, false_blind: int, served_floor: float) -> None:
    # the ten draws of docs/thermal.md; false BLIND episodes cost throughput only and are counted there. Session 17
    # traded 0.001-0.002 of three draws' floors and one 5 s false BLIND (3/5) for the guard on hot readings held at
    # it, which keeps most plants under 75 °C when a fan stops (docs/thermal.md, "A fan that stops"). Session 20 traded
    # 0.0006 of draw 41/42's floor (0.8870 -> 0.8864) for the swing margin, which keeps 22 of 160 plants under 75 °C
    # under a load that comes and goes each second (docs/thermal.md, "Swing margin"); the other nine draws held.
    # The goal is served >= 0.90 of the ideal tracker on every healthy or flaky cell. Against the corrected tracker
    # (session 13: it had undercounted its own work under the power limit) no draw meets it: each draw's lowest
    # cell is its measured floor here, a regression guard and not the goal (docs/thermal.md, "Results").
    cells = mx.run_matrix(mx.matrix_plants(30, plant_seed), mx.FAULTS, hours=4.0, seed=seed)
    summary = mx.summarize(cells)
    assert summary["max_seconds_above"] == 0.0
    assert summary["false_blind_episodes"] <= false_blind
    assert summary["min_ratio_ideal_healthy"] >= served_floor - 0.0005
    assert summary["max_peak_to_peak_c"] <= 1.5
    short_of_the_goal = re.compile(r"served 0\.\d+ of ideal < 0\.90")
    assert all(c.passed or short_of_the_goal.fullmatch(c.why) for c in cells), [c for c in cells if not c.passed]
    assert all(c.detection_s is not None for c in cells if c.fault not in ("none", "flaky"))


@pytest.mark.parametrize("name", ["rand7-22", "rand7-17", "rand7-9"])
def test_an_uncommissioned_governor_holds_the_wall_when_the_reading_freezes_while_the_die_warms(name: str) -> None:
    # ThermalConfig() with only the blind duty commissioned (the nameplate defaults: 575 W, no heatsink fit) on the
    # plants where it reached 75.3-75.6 °C before the heatsink default and the learned-watts scaling
    row = next(r for r in mx.matrix_plants(30, 7) if r.plant.name == name)
    profile = mx.matrix_profile(row.room_c, 4.0, 1)
    profile.faults = mx.fault_windows("stuck_warming", len(profile.demand))
    res = run_profile(profile, row.plant, row.sensor, ThermalConfig(blind_duty=row.blind_duty), seed=1, limit_c=75.0)
    assert res.seconds_above == 0.0 and res.max_die_c < 75.0
    assert any(s is GovernorState.BLIND for s in res.state)  # and the frozen reading was caught


def test_no_false_blind_after_a_burst_from_idle_on_a_quiet_floored_sensor() -> None:
    # rand23-7: the reading stalls 34 s after a climb from idle while the PI winds the power down; the heatsink,
    # warmed from cold with the fan starting, is still taking up heat, so the one-node heatsink model's "fall" must
    # not be judged yet (it went BLIND falsely in every column before)
    row = next(r for r in mx.matrix_plants(30, 23) if r.plant.name == "rand23-7")
    cell = mx.run_cell(row, "none", 4.0, 24)
    assert cell.passed and cell.false_blind_episodes == 0 and cell.blind_s == 0
