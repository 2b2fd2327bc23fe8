"""The bench report's derived figures (appliance.tools.benchreport): ratios and targets from numbers alone."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.tools import benchreport


def _point(rate: float, p50: float, p99: float, cpu: float) -> dict[str, Any]:
    return {"throughput_per_s": rate, "latency_ms": {"p50": p50, "p99": p99, "jitter": round(p99 / p50, 3)},
            "cpu_ms_per_request": cpu, "errors": {}}


def test_the_report_gives_each_ratio_against_the_peer_and_the_ceiling_and_each_target_its_verdict() -> None:
    report: dict[str, Any] = {
        "costs": {"preprocess": {"median_ms": 3.0}, "engine_batch_ms": 14.0},
        "ceiling": {"cpu_ceiling_per_s": 200.0, "pipelined_bound_per_s": 130.0},
        "engine_flops_ratio": 1.3, "preprocess_uncompressed_ms": 0.9,
    }
    results = {
        "sweep": {"appliance": {1: _point(50.0, 18.0, 30.0, 28.0), 16: _point(160.0, 90.0, 150.0, 11.0)},
                  "triton": {1: _point(40.0, 25.0, 40.0, 30.0), 16: _point(100.0, 150.0, 300.0, 12.0)}},
        "capacity_per_s": {"appliance": 160.0, "triton": 100.0},
        "poisson": {"rate_per_s": 70.0, "appliance": _point(70.0, 40.0, 100.0, 14.0),
                    "triton": _point(70.0, 60.0, 200.0, 15.0)},
    }
    scores = [{i: i / 10 for i in range(5)}, {i: i / 10 + 0.001 for i in range(5)}]
    benchreport.fill(report, results, 16, scores, {"config": {"instances": 2}})
    benchreport.targets(report)
    assert report["throughput_per_s"] == 160.0 and report["latency_jitter_p99_p50"] == pytest.approx(1.667)
    assert report["ceiling_fraction"] == 0.8 and report["pipelined_fraction"] == pytest.approx(1.231)
    assert report["single_client"]["bound_ms"] == pytest.approx(1.15 * 17.0 + 2.0)
    peer = report["peer"]
    assert peer["saturated_throughput_ratio"] == 1.6 and peer["poisson_p99_ratio"] == 0.5
    assert peer["cpu_per_request_ratio"] == pytest.approx(11.0 / 12.0, abs=1e-3)
    assert peer["score_agreement"]["r"] == pytest.approx(1.0) and peer["config"] == {"instances": 2}
    t = report["targets"]
    assert t["peer_saturated_throughput_ratio"]["met"] and t["peer_poisson_p99_ratio"]["met"]
    assert t["peer_cpu_per_request_ratio"]["met"] and t["single_client_p50_ms"]["met"]
    assert t["ceiling_fraction"] == {"value": 0.8, "goal": ">= 0.9", "met": False}
    assert t["poisson_jitter_p99_p50"]["met"] is False  # 100 / 40 = 2.5 against <= 1.5
    assert benchreport.ratio(None, 2.0) is None and benchreport.ratio(1.0, 0.0) is None


def test_without_a_peer_or_costs_the_report_claims_no_target_it_did_not_measure() -> None:
    report: dict[str, Any] = {}
    results = {"sweep": {"appliance": {4: _point(90.0, 40.0, 80.0, 16.0)}}, "capacity_per_s": {"appliance": 90.0}}
    benchreport.fill(report, results, 4, [{}], {})
    benchreport.targets(report)
    assert "peer" not in report and "ceiling_fraction" not in report and "single_client" not in report
    assert "targets" not in report
