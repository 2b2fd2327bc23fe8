"""``appliance thermal-sim``: run the governor against the simulated plant, or the fault matrix.

One run (default): the 24 h acceptance profile on one plant and sensor, with an optional fault; exits 1
when a target fails. ``--matrix``: every sensor fault on randomised plants (:mod:`appliance.thermal.matrix`),
written as JSON and a PNG; exits 1 when a cell fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence

from appliance.thermal.governor import ThermalConfig
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
    ap.add_argument("--hours", type=float, default=24.0, help="profile length; < 24 compresses the day")
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


if __name__ == "__main__":
    raise SystemExit(main())
