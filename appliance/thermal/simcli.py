"""``appliance thermal-sim``: run the governor against the simulated plant, or the fault matrix.

One run (default): the 24 h acceptance profile on one plant and sensor, with an optional fault; exits 1
when a target fails. ``--matrix``: every sensor fault on randomised plants (:mod:`appliance.thermal.matrix`),
written as JSON and a PNG; exits 1 when a cell fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Sequence

from appliance.thermal.governor import ThermalConfig
from appliance.thermal.matrix import EXTRA_FAULTS, FAULTS, Cell, matrix_plants, run_matrix, summarize
from appliance.thermal.plant import PRESETS, SensorParams
from appliance.thermal.sim import FAULT_KINDS, Profile, SimResult, day_profile, evaluate, fault_schedule

__all__ = ["main"]


def _plot(res: SimResult, profile: Profile, path: str, limit_c: float) -> None:
    import matplotlib  # dev-only; imported lazily

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [t / 3600.0 for t in range(len(res.die))]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(12, 6))
    ax1.plot(hours, res.die, lw=0.6, label="true die °C")
    ax1.plot(hours, profile.ambient, lw=0.6, label="room °C")
    ax1.axhline(limit_c, color="r", lw=0.8, ls="--", label=f"limit {limit_c:g} °C")
    ax1.set_ylabel("°C")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.plot(hours, res.duty, lw=0.6, label="duty")
    ax2.plot(hours, profile.demand, lw=0.4, alpha=0.5, label="demand")
    ax2.set_ylabel("fraction")
    ax2.set_xlabel("hours")
    ax2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="appliance thermal-sim",
                                 description="Run the thermal governor against the simulated GPU plant.")
    ap.add_argument("--matrix", action="store_true",
                    help="run the fault matrix on randomised plants instead of one day (JSON/PNG with --json/--plot)")
    ap.add_argument("--plants", type=int, default=10, help="with --matrix: random plants besides the two named ones")
    ap.add_argument("--plant-seed", type=int, default=7, help="with --matrix: seed of the random plants")
    ap.add_argument("--faults", default=",".join(FAULTS), help="with --matrix: comma-separated fault columns")
    ap.add_argument("--hours", type=float, default=None,
                    help="profile length (default 24; 3 with --matrix); < 24 compresses the day")
    ap.add_argument("--json", metavar="FILE", help="write metrics and a 10 s trace as JSON")
    ap.add_argument("--plot", metavar="FILE.png", help="plot temperature and duty (needs matplotlib)")
    ap.add_argument("--plant", choices=sorted(PRESETS), default="5090")
    ap.add_argument("--delay-s", type=float, default=1.0, help="sensor delay, s")
    ap.add_argument("--quantize", choices=("floor", "round"), default="floor")
    ap.add_argument("--noise-c", type=float, default=0.25, help="sensor noise σ, °C")
    ap.add_argument("--seed", type=int, default=1, help="demand and noise seed")
    ap.add_argument("--fault", choices=FAULT_KINDS, default="none")
    ap.add_argument("--r-jh-scale", type=float, default=1.0, help="scale die-to-heatsink resistance")
    ap.add_argument("--heatsink-scale", type=float, default=1.0, help="scale heatsink capacity (its τ)")
    ap.add_argument("--die-scale", type=float, default=1.0, help="scale die capacity (its τ)")
    ap.add_argument("--power-limit-w", type=float, default=None, help="firmware power limit, W")
    ap.add_argument("--no-power", action="store_true", help="hide power readings (nameplate model)")
    ap.add_argument("--setpoint-c", type=float, default=None,
                    help="governor setpoint, °C (the guard moves to setpoint + 1 if needed)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``appliance thermal-sim``; return 0 when every target is met, 1 otherwise."""
    args = _parser().parse_args(argv)
    if args.matrix:
        return _matrix(args, list(argv) if argv is not None else None)
    args.hours = 24.0 if args.hours is None else args.hours
    plant = PRESETS[args.plant].scaled(args.r_jh_scale, args.heatsink_scale, args.die_scale)
    if args.power_limit_w is not None:
        plant = dataclasses.replace(plant, p_limit_w=args.power_limit_w)
    sensor = SensorParams(args.delay_s, args.quantize, args.noise_c)
    config = ThermalConfig()
    if args.setpoint_c is not None:
        config = ThermalConfig(setpoint_c=args.setpoint_c, guard_c=max(config.guard_c, args.setpoint_c + 1.0))
    profile = day_profile(args.hours, seed=args.seed)
    profile.faults = fault_schedule(args.fault, len(profile.demand), args.hours / 24.0)
    out = evaluate(profile, plant, sensor, config, seed=args.seed, measure_power=not args.no_power,
                   fault=args.fault)
    res: SimResult = out.pop("result")  # type: ignore[assignment]
    metrics, checks = out["metrics"], out["checks"]
    assert isinstance(metrics, dict) and isinstance(checks, dict)
    print(f"thermal-sim: plant {plant.name}, {args.hours:g} h, delay {args.delay_s:g} s, "
          f"{args.quantize}, noise {args.noise_c:g} °C, fault {args.fault}")
    for key, value in metrics.items():
        print(f"  {key:28s} {value}")
    for key, ok in checks.items():
        print(f"  check {key:22s} {'PASS' if ok else 'FAIL'}")
    print("PASS" if out["passed"] else "FAIL")
    if args.json:
        doc = {
            "args": vars(args), "plant": dataclasses.asdict(plant), "sensor": dataclasses.asdict(sensor),
            "config": dataclasses.asdict(config), **out,
            "trace_10s": {
                "t_s": list(range(0, len(res.die), 10)),
                "die_c": [round(x, 2) for x in res.die[::10]],
                "duty": [round(x, 3) for x in res.duty[::10]],
                "demand": [round(x, 3) for x in profile.demand[::10]],
                "ambient_c": [round(x, 2) for x in profile.ambient[::10]],
                "state": res.state[::10],
            },
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    if args.plot:
        _plot(res, profile, args.plot, config.limit_c)
    return 0 if out["passed"] else 1



def _matrix(args: argparse.Namespace, argv: list[str] | None) -> int:
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS + EXTRA_FAULTS]
    if unknown:
        print(f"thermal-sim: unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS + EXTRA_FAULTS)}")
        return 2
    hours = 3.0 if args.hours is None else args.hours
    rows = matrix_plants(args.plants, args.plant_seed)
    cells = run_matrix(rows, faults, hours, args.seed)
    summary = summarize(cells)
    print(f"thermal-sim --matrix: {len(rows)} plants x {len(faults)} faults, {hours:g} h each, "
          f"plant seed {args.plant_seed}, seed {args.seed}")
    print(f"  {'plant':12s} {'fault':16s} {'s>75':>6s} {'max°C':>6s} {'served':>6s} {'/ideal':>6s} {'p-p':>5s} "
          f"{'det s':>6s} {'falseB':>6s}  result")
    for c in cells:
        pp = "-" if c.peak_to_peak_c is None else f"{c.peak_to_peak_c:.2f}"
        det = "-" if c.detection_s is None else f"{c.detection_s:.0f}"
        print(f"  {c.plant:12s} {c.fault:16s} {c.seconds_above:6.1f} {c.max_die_c:6.2f} {c.served:6.3f} "
              f"{c.ratio_ideal:6.3f} {pp:>5s} {det:>6s} {c.false_blind_episodes:6d}  "
              f"{'PASS' if c.passed else 'FAIL ' + c.why}")
    for key, value in summary.items():
        print(f"  {key:28s} {value}")
    ok = summary["passed"] == summary["cells"]
    print("PASS" if ok else "FAIL")
    if args.json:
        doc = {"command": "appliance thermal-sim " + " ".join(argv if argv is not None else sys.argv[2:]),
               "hours": hours, "seed": args.seed, "plant_seed": args.plant_seed,
               "plants": [r.describe() for r in rows], "faults": faults,
               "cells": [c.as_dict() for c in cells], "summary": summary}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    if args.plot:
        _plot_matrix(cells, [r.plant.name for r in rows], faults, args.plot)
    return 0 if ok else 1


def _plot_matrix(cells: list[Cell], plants: list[str], faults: list[str], path: str) -> None:
    import matplotlib  # dev-only; imported lazily

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(c.plant, c.fault): c for c in cells}
    panels: list[tuple[str, Callable[[Cell], float | None], str, float, float]] = [
        ("seconds above 75 °C", lambda c: c.seconds_above, "Reds", 0.0, 10.0),
        ("served / ideal tracker", lambda c: c.ratio_ideal, "RdYlGn", 0.3, 1.0),
        ("die peak-to-peak settled, °C", lambda c: c.peak_to_peak_c, "Oranges", 0.0, 2.0),
        ("detection time, s", lambda c: c.detection_s, "Blues", 0.0, 300.0),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(4.2 * 4, 0.45 * len(plants) + 2.2))
    for ax, (title, get, cmap, lo, hi) in zip(axes, panels, strict=True):
        grid = [[get(by[(p, f)]) if (p, f) in by else None for f in faults] for p in plants]
        data = [[math.nan if v is None else float(v) for v in row] for row in grid]
        ax.imshow(data, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                text = "-" if v is None else (f"{v:.0f}" if hi > 5 else f"{v:.2f}")
                ax.text(j, i, text, ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(faults)), faults, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(plants)), plants if ax is axes[0] else [""] * len(plants), fontsize=7)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
