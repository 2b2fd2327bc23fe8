"""The bench report's derived figures: ratios against the peer and the ceilings, and each target with its goal.

Pure: numbers in, report fields out (``appliance.tools.benchrun`` measures; docs/performance.md, section 7, names
the fields).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fill", "ratio", "targets"]


def _agreement(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return {"n": len(common), "r": None}
    x = np.asarray([a[i] for i in common])
    y = np.asarray([b[i] for i in common])
    r = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else None
    return {"n": len(common), "r": round(r, 6) if r is not None else None,
            "max_abs_diff": round(float(np.abs(x - y).max()), 6)}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 decimals; None when either is missing (or ``b`` is 0)."""
    return round(a / b, 3) if a is not None and b else None


def fill(report: dict[str, Any], results: dict[str, Any], concurrency: int, scores: list[dict[int, float]],
         peer_info: dict[str, Any]) -> None:
    """Fill ``report`` from the load patterns' ``results``.

    The main figures at ``concurrency``, the ceiling fractions, the single client against its bound and, with a
    peer's ``scores`` beside the appliance's, the ratios against the peer.
    """
    app = results["sweep"]["appliance"]
    main = dict(app[concurrency])
    main["latency_ms"] = dict(main["latency_ms"])
    jitter = main["latency_ms"].pop("jitter", None)
    report.update(main)  # the stable fields: throughput_per_s, latency_ms, stages_ms, batch_fill, errors, server
    report["latency_jitter_p99_p50"] = jitter
    for pattern in ("sweep", "capacity_per_s", "poisson", "poisson_own", "bursts"):
        if pattern in results:
            report[pattern] = results[pattern]
    if "ceiling" in report:
        ceil = report["ceiling"]
        report["ceiling_fraction"] = ratio(report["capacity_per_s"]["appliance"], ceil["cpu_ceiling_per_s"])
        report["pipelined_fraction"] = ratio(report["capacity_per_s"]["appliance"], ceil["pipelined_bound_per_s"])
        costs = report["costs"]
        t_pre = costs["preprocess"]["median_ms"]
        single = app.get(1)
        if single:
            bound = 1.15 * (t_pre + costs["engine_batch_ms"]) + 2.0
            report["single_client"] = {"p50_ms": single["latency_ms"]["p50"], "t_pre_ms": t_pre,
                                       "t_engine_batch_ms": costs["engine_batch_ms"], "bound_ms": round(bound, 2),
                                       "ratio_to_t_pre_plus_t_engine": ratio(
                                           single["latency_ms"]["p50"], t_pre + costs["engine_batch_ms"])}
    if len(scores) > 1:
        tri = results["sweep"]["triton"]
        top = max(app)
        peer: dict[str, Any] = {"name": "triton", **peer_info}
        peer["throughput_ratio"] = {c: ratio(app[c]["throughput_per_s"], tri[c]["throughput_per_s"]) for c in app}
        peer["p99_ratio"] = {c: ratio(app[c]["latency_ms"]["p99"], tri[c]["latency_ms"]["p99"]) for c in app}
        peer["saturated_concurrency"] = top
        peer["saturated_throughput_ratio"] = peer["throughput_ratio"][top]
        peer["cpu_ms_per_request"] = {"appliance": app[top].get("cpu_ms_per_request"),
                                      "triton": tri[top].get("cpu_ms_per_request")}
        peer["cpu_per_request_ratio"] = ratio(*peer["cpu_ms_per_request"].values())
        if "poisson" in results:
            pa, pt = results["poisson"]["appliance"], results["poisson"]["triton"]
            peer["poisson_rate_per_s"] = results["poisson"]["rate_per_s"]
            peer["poisson_p99_ratio"] = ratio(pa["latency_ms"]["p99"], pt["latency_ms"]["p99"])
            peer["poisson_jitter"] = {"appliance": pa["latency_ms"]["jitter"], "triton": pt["latency_ms"]["jitter"]}
            peer["poisson_cpu_per_request_ratio"] = ratio(pa.get("cpu_ms_per_request"), pt.get("cpu_ms_per_request"))
        if "bursts" in results:
            peer["bursts_p99_ratio"] = ratio(results["bursts"]["appliance"]["latency_ms"]["p99"],
                                              results["bursts"]["triton"]["latency_ms"]["p99"])
        peer["score_agreement"] = _agreement(scores[0], scores[1])
        report["peer"] = peer


def _target(value: float | None, goal: float, op: str) -> dict[str, Any]:
    met = None if value is None else (value >= goal if op == ">=" else value <= goal)
    return {"value": value, "goal": f"{op} {goal}", "met": met}


def targets(report: dict[str, Any]) -> None:
    """Each goal of issue #11 / docs/performance.md with its figure from this run."""
    peer = report.get("peer", {})
    t: dict[str, Any] = {}
    if peer:
        t["peer_saturated_throughput_ratio"] = _target(peer.get("saturated_throughput_ratio"), 1.3, ">=")
        t["peer_poisson_p99_ratio"] = _target(peer.get("poisson_p99_ratio"), 0.7, "<=")
        t["peer_cpu_per_request_ratio"] = _target(peer.get("cpu_per_request_ratio"), 1.0, "<=")
    if "ceiling_fraction" in report:
        t["ceiling_fraction"] = _target(report["ceiling_fraction"], 0.9, ">=")
        t["pipelined_fraction"] = _target(report["pipelined_fraction"], 0.9, ">=")
    if "self" in report:
        t["self_speedup_vs_sequential"] = _target(report["self"]["speedup_vs_sequential"], 1.6, ">=")
        if "speedup_vs_ideal_sequential" in report["self"]:
            t["self_speedup_vs_ideal_sequential"] = _target(report["self"]["speedup_vs_ideal_sequential"], 1.6, ">=")
    jitter = (report.get("poisson_own") or report.get("poisson") or {}).get("appliance", {}).get("latency_ms", {})
    if jitter:
        t["poisson_jitter_p99_p50"] = _target(jitter.get("jitter"), 1.5, "<=")
    if "single_client" in report:
        sc = report["single_client"]
        t["single_client_p50_ms"] = _target(sc["p50_ms"], sc["bound_ms"], "<=")
    if "engine_flops_ratio" in report:
        t["engine_flops_ratio"] = _target(report["engine_flops_ratio"], 0.7, ">=")
        t["preprocess_uncompressed_ms"] = _target(report["preprocess_uncompressed_ms"], 1.5, "<=")
    if t:
        report["targets"] = t
