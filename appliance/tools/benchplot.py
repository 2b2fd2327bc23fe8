"""PNGs for ``appliance bench --plot PREFIX``: latency distributions and throughput against concurrency.

Needs matplotlib (the ``dev`` extra); without it the report says why no plot was written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot"]

_COLOURS = {"appliance": "tab:blue", "triton": "tab:orange"}


def plot(report: dict[str, Any], raw: dict[str, dict[str, list[float]]], prefix: str) -> dict[str, str]:
    """Write ``PREFIX-latency.png`` and ``PREFIX-throughput.png``; return the paths (or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {"error": "matplotlib is not installed (pip install 'edge-appliance[dev]')"}
    paths = {"latency": f"{prefix}-latency.png", "throughput": f"{prefix}-throughput.png"}

    patterns = [p for p in ("poisson", f"closed-{report.get('concurrency')}", "bursts", "closed-1")
                if any(p in r for r in raw.values())]
    fig, axes = plt.subplots(1, max(1, len(patterns)), figsize=(4.2 * max(1, len(patterns)), 3.6), squeeze=False)
    for ax, pattern in zip(axes[0], patterns, strict=False):
        for name, by_pattern in raw.items():
            lat = np.sort(np.asarray(by_pattern.get(pattern, [])))
            if lat.size == 0:
                continue
            q = np.arange(1, lat.size + 1) / lat.size
            p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
            ax.plot(lat, q, color=_COLOURS.get(name), label=f"{name} p50 {p50:.0f} / p99 {p99:.0f} ms")
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(_title(pattern, report), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"latency CDF, workload {report.get('workload')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths["latency"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in report.get("sweep", {}).items():
        cs = sorted(points, key=int)
        ax.plot([int(c) for c in cs], [points[c]["throughput_per_s"] for c in cs], "o-", color=_COLOURS.get(name),
                label=name)
    ceiling = report.get("ceiling", {})
    for key, style in (("cpu_ceiling_per_s", "--"), ("pipelined_bound_per_s", ":")):
        if key in ceiling:
            ax.axhline(ceiling[key], color="grey", linestyle=style, label=f"{key.replace('_per_s', '')} "
                       f"{ceiling[key]:.0f}/s")
    ax.set_xlabel("closed-loop clients")
    ax.set_ylabel("answered requests / s")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"throughput vs concurrency, workload {report.get('workload')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths["throughput"], dpi=110)
    plt.close(fig)
    return paths


def _title(pattern: str, report: dict[str, Any]) -> str:
    if pattern == "poisson":
        p = report.get("poisson", {})
        return f"Poisson {p.get('rate_per_s')}/s ({p.get('fraction')} of capacity)"
    if pattern == "bursts":
        b = report.get("bursts", {})
        return f"bursts of {b.get('size')} every {b.get('period_s')} s"
    return f"closed loop, {pattern.split('-')[1]} clients"
