"""Closed-loop acceptance of the governor on the simulated plant (compressed day profile).

The default run compresses the 24 h profile to 6 h (same phases, ambient steps and faults); the full
24 h matrix is marked slow. Every case must keep the TRUE die at 0 s above 75.0 °C.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from appliance.thermal import plant as tp
from appliance.thermal import sim as ts
from appliance.thermal import simcli
from appliance.thermal.governor import GovernorState
from appliance.thermal.plant import PRESETS, SensorParams

P5090 = PRESETS["5090"]

# name -> evaluate() keyword arguments: plants and sensors the governor was NOT tuned on
VARIANTS: dict[str, dict[str, object]] = {
    "4090": {"plant": PRESETS["4090"]},
    "pro6000maxq": {"plant": PRESETS["pro6000maxq"]},
    "delay2": {"sensor": SensorParams(2.0)},
    "delay3": {"sensor": SensorParams(3.0)},
    "round": {"sensor": SensorParams(1.0, "round")},
    "noise0.5": {"sensor": SensorParams(1.0, "floor", 0.5)},
    "rjh+40%": {"plant": P5090.scaled(r_jh_scale=1.4)},
    "heatsink-slow": {"plant": P5090.scaled(heatsink_scale=2.0)},
    "heatsink-fast": {"plant": P5090.scaled(heatsink_scale=0.5)},
    "die-slow": {"plant": P5090.scaled(die_scale=2.0)},
    "no-power-readings": {"measure_power": False},
    "4090-delay3-round-noisy": {"plant": PRESETS["4090"], "sensor": SensorParams(3.0, "round", 0.5)},
    "heatsink-slow-delay3": {"plant": P5090.scaled(heatsink_scale=2.0), "sensor": SensorParams(3.0)},
    "5090-delay3-round-noisy": {"sensor": SensorParams(3.0, "round", 0.5)},
    "pro6000maxq-heatsink-fast-delay2": {
        "plant": PRESETS["pro6000maxq"].scaled(heatsink_scale=0.5),
        "sensor": SensorParams(2.0),
    },
}
FAST = ["4090", "delay3", "round", "heatsink-slow", "heatsink-fast", "no-power-readings", "5090-delay3-round-noisy"]


@pytest.fixture(scope="module")
def profile6() -> ts.Profile:
    return ts.day_profile(6.0)


def check(out: dict[str, object]) -> dict[str, object]:
    metrics = out["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["seconds_above_limit"] == 0.0, metrics
    assert metrics["max_die_c"] < 75.0
    assert out["passed"], out["checks"]
    return metrics


def test_nominal_compressed_meets_every_target(profile6: ts.Profile) -> None:
    m = check(ts.evaluate(profile6))
    assert m["ratio_ideal"] >= 0.90 and m["ratio_constant"] >= 1.30
    assert m["peak_to_peak_c"] is not None and m["peak_to_peak_c"] <= 1.5 and m["settled_windows"] > 5
    assert len(m["settle_s"]) == 2 and max(m["settle_s"]) <= 300  # type: ignore[arg-type]
    assert m["readings_at_or_above_limit"] == 0 and m["blind_samples"] == 0


@pytest.mark.parametrize("name", FAST)
def test_robustness_compressed(profile6: ts.Profile, name: str) -> None:
    check(ts.evaluate(profile6, **VARIANTS[name]))  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nominal", *VARIANTS])
def test_robustness_full_day(name: str, request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("24 h matrix: run with -m slow")
    check(ts.evaluate(ts.day_profile(24.0), **VARIANTS.get(name, {})))  # type: ignore[arg-type]


@pytest.mark.parametrize("fault", [f for f in ts.FAULT_KINDS if f != "none"])
@pytest.mark.parametrize("delay", [1.0, 3.0])
def test_faults_on_profile(profile6: ts.Profile, fault: str, delay: float) -> None:
    prof = ts.Profile(
        profile6.demand, profile6.ambient, profile6.fan_scale, ts.fault_schedule(fault, len(profile6.demand), 0.25)
    )
    out = ts.evaluate(prof, sensor=SensorParams(delay), fault=fault)
    check(out)
    if fault == "lost":
        res = out["result"]
        assert isinstance(res, ts.SimResult)
        first = int(min(f.start_s for f in prof.faults))
        assert res.duty[first] == 0.0 and res.state[first] is GovernorState.STOPPED
        assert res.duty[first - 1] > 0.0


HOT_ROOM_FAULTS = {
    "read_error_at_load_step": [tp.Fault("read_error", 600, 2400)],
    "stuck_at_load_step": [tp.Fault("stuck", 600, 2400)],
    "stuck_at_steady_load": [tp.Fault("stuck", 1800, 3000)],
    "garbage": [tp.Fault("garbage", 0, 3600)],
    "lost": [tp.Fault("lost", 1500, math.inf)],
}


@pytest.mark.parametrize("plant", ["5090", "4090"])
@pytest.mark.parametrize("name", list(HOT_ROOM_FAULTS))
def test_faults_in_a_hot_room(name: str, plant: str) -> None:
    """35 → 40 °C room, idle then full load, 3 s sensor delay (notes §6)."""
    demand = [0.0] * 900 + [1.0] * 2700
    ambient = [35.0] * 1200 + [40.0] * 2400
    prof = ts.Profile(demand, ambient, [1.0] * 3600, HOT_ROOM_FAULTS[name])
    res = ts.run_profile(prof, PRESETS[plant], SensorParams(3.0))
    assert res.seconds_above == 0.0 and res.max_die_c < 75.0
    if name.startswith(("read_error", "stuck")):
        assert GovernorState.BLIND in res.state
    if name == "stuck_at_load_step":  # detected within ~15 s of the load step
        assert GovernorState.BLIND in res.state[900:915]


def test_stuck_detection_no_false_trigger_on_long_steady_load() -> None:
    prof = ts.Profile([1.0] * 3600, [25.0] * 3600, [1.0] * 3600)
    res = ts.run_profile(prof, sensor=SensorParams(1.0, "floor", 0.0))
    assert "BLIND" not in res.state and res.seconds_above == 0.0


def test_oracles_bracket_the_governor(profile6: ts.Profile) -> None:
    u, served_const = ts.best_constant_duty(profile6)
    ideal = ts.ideal_tracker(profile6)
    assert 0.45 < u < 0.65 and served_const < ideal < 1.0


def test_plant_steady_state_matches_notes() -> None:
    plant = tp.Plant(ambient_c=25.0)
    plant.advance(3000.0, 1.0)
    assert plant.tj == pytest.approx(76.2, abs=0.6)
    plant4 = tp.Plant(PRESETS["4090"], ambient_c=21.5)
    plant4.advance(3000.0, 1.0)
    assert plant4.tj == pytest.approx(68.0, abs=0.8)


def test_sensor_quantises_and_delays() -> None:
    plant = tp.Plant(ambient_c=25.0)
    sensor = tp.Sensor(SensorParams(2.0, "floor", 0.0))
    plant.advance(1.0, 1.0)
    assert sensor.read(plant) == math.floor(plant.die_delayed(2.0)) and sensor.read(plant) < plant.tj
    with pytest.raises(ValueError, match="quantize"):
        tp.Sensor(SensorParams(1.0, "ceil"))


def test_cli_writes_json_and_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    rc = simcli.main(["--hours", "3", "--json", str(out), "--delay-s", "2", "--quantize", "round"])
    text = capsys.readouterr().out
    assert rc == 0 and "PASS" in text and "seconds_above_limit" in text
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["metrics"]["seconds_above_limit"] == 0.0
    assert len(doc["trace_10s"]["die_c"]) == 3 * 360


def test_cli_fault_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "r.png"
    assert simcli.main(["--hours", "1", "--fault", "lost", "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000
    assert "lost_stops" in capsys.readouterr().out


def test_cli_fails_when_a_target_fails(capsys: pytest.CaptureFixture[str]) -> None:
    # a setpoint at the limit with a 3 s delay must overshoot: the command reports FAIL and exits 1
    assert simcli.main(["--hours", "2", "--setpoint-c", "74.6", "--delay-s", "3"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_the_ideal_tracker_counts_its_work_under_the_power_limit() -> None:
    """Held-out review: the tracker inferred its work from energy without the power limit's cap, undercounting it."""
    import dataclasses

    limited = dataclasses.replace(PRESETS["5090"], p_limit_w=0.7 * PRESETS["5090"].p_max_w)
    n = 1800
    profile = ts.Profile([1.0] * n, [25.0] * n, [1.0] * n, [])
    # a limit the die never reaches: the tracker never cuts, so it serves every second demanded
    assert ts.ideal_tracker(profile, limited, limit_c=150.0) == pytest.approx(1.0, abs=1e-9)
    # and with the real limit it serves what it let the plant run, never more than demanded
    served = ts.ideal_tracker(profile, limited, limit_c=75.0)
    assert 0.0 < served <= 1.0
