"""Render the Grafana dashboard's panels headless from a real Prometheus, with matplotlib (no Grafana needed).

Grafana cannot be installed on the build machines (no Docker, not packaged by Debian), so docs/monitoring.md's
screenshot is made like this: Prometheus scrapes a daemon during `appliance bench`; this script runs every
panel's PromQL (``$instance`` -> ``.*``, ``$__rate_interval`` -> ``--rate``) through Prometheus' HTTP API
(``query_range``; ``instant`` targets at the end of the window) and draws the panels on the dashboard's own
24-column grid. Units, legends and threshold lines follow the panel definitions; styling does not try to be
Grafana's.

    python docs/grafana/render_dashboard.py --prometheus http://127.0.0.1:9090 --start T0 --end T1 --out png
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DASHBOARD = Path(__file__).with_name("edge-appliance.json")
#: unit -> (scale, axis label)
UNITS = {
    "s": (1e3, "ms"),
    "percentunit": (100.0, "%"),
    "celsius": (1.0, "°C"),
    "reqps": (1.0, "req/s"),
    "watt": (1.0, "W"),
}


def query(prometheus: str, expr: str, start: float, end: float, step: float, instant: bool) -> list[dict[str, Any]]:
    """Run one PromQL expression; return Prometheus' result list."""
    if instant:
        url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": end})
    else:
        params = {"query": expr, "start": start, "end": end, "step": step}
        url = f"{prometheus}/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or "value"


def render(prometheus: str, start: float, end: float, step: float, rate: str, out: Path, subtitle: str) -> None:
    """Draw every panel of the dashboard into ``out`` (PNG)."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    plt.style.use("dark_background")
    fig = plt.figure(figsize=(24, rows * 0.62))
    grid = fig.add_gridspec(rows, 24, hspace=6.0, wspace=3.0, left=0.04, right=0.99, top=0.95, bottom=0.02)
    t0 = start
    for panel in panels:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"] : g["y"] + g["h"], g["x"] : g["x"] + g["w"]])
        ax.set_title(panel["title"], loc="left", fontsize=11, color="#d8d9da")
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        scale, label = UNITS.get(unit, (1.0, ""))
        if panel["type"] == "table":
            ax.axis("off")
            lines = []
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", rate).replace("$instance", ".*")
                for series in query(prometheus, expr, start, end, step, True):
                    lines.append(legend(target["legendFormat"], series["metric"]))
            ax.text(0.0, 0.9, "\n".join(lines) or "no data", va="top", family="monospace", fontsize=10)
            continue
        if panel["type"] == "state-timeline":  # one bar per series where its value is present and non-zero
            names = []
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", rate).replace("$instance", ".*")
                for series in query(prometheus, expr, start, end, step, False):
                    spans = [(float(t) - t0, step) for t, v in series["values"] if float(v) != 0.0]
                    ax.broken_barh(spans, (len(names) + 0.1, 0.8), color=f"C{len(names)}")
                    names.append(legend(target["legendFormat"], series["metric"]))
            ax.set_yticks([i + 0.5 for i in range(len(names))], names, fontsize=9)
            ax.set_ylim(0, max(1, len(names)))
            ax.set_xlim(0, end - start)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.15, axis="x")
            continue
        drawn = 0
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate).replace("$instance", ".*")
            for series in query(prometheus, expr, start, end, step, False):
                xs = [float(t) - t0 for t, _ in series["values"]]
                ys = [float(v) * scale for _, v in series["values"]]
                ax.plot(xs, ys, linewidth=1.4, label=legend(target["legendFormat"], series["metric"]))
                drawn += 1
        for step_ in panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", []):
            if step_.get("value") is not None:
                ax.axhline(step_["value"] * scale, color="#f2495c", linestyle="--", linewidth=1)
        if drawn:
            ax.legend(loc="upper left", fontsize=8, framealpha=0.3)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#8e8e8e")
        if panel["fieldConfig"]["defaults"].get("custom", {}).get("scaleDistribution", {}).get("type") == "log":
            ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=9)
        ax.set_xlim(0, end - start)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.15)
    when = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M UTC")
    fig.suptitle(
        f"{dashboard['title']} — {when}, x: seconds into the run — {subtitle}", x=0.04, ha="left", fontsize=13
    )
    fig.savefig(out, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--start", type=float, required=True, help="unix seconds")
    parser.add_argument("--end", type=float, required=True, help="unix seconds")
    parser.add_argument("--step", type=float, default=2.0)
    parser.add_argument("--rate", default="20s", help="what $__rate_interval becomes")
    parser.add_argument("--subtitle", default="rendered from Prometheus by docs/grafana/render_dashboard.py")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    render(args.prometheus, args.start, args.end, args.step, args.rate, args.out, args.subtitle)


if __name__ == "__main__":
    main()
