"""Render a bench.json as the markdown tables of docs/performance.md.

Usage: python bench/report_md.py bench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def costs(r: dict[str, Any]) -> None:
    c = r.get("costs", {})
    if c:
        pre = c["preprocess"]
        print("Per-slice CPU costs (one pinned core, thread CPU time, median per file):\n")
        print("| stage | ms |\n|---|---|")
        for name, ms in pre["by_syntax_ms"].items():
            print(f"| bytes to slot, {name} | {_f(ms)} |")
        print(f"| bytes to slot, workload mean / median | {_f(pre['mean_ms'])} / {_f(pre['median_ms'])} |")
        print(f"| uncompressed 512x512, median | {_f(r.get('preprocess_uncompressed_ms'))} |")
        print(f"| engine, one batch of {c['batch_size']} | {_f(c['engine_batch_ms'])} "
              f"({_f(c['engine_per_slice_ms'])} per slice) |")
        print(f"| engine GFLOP/s ({_f(c['model_gflop_per_batch'], 3)} GFLOP per batch) / single-thread SGEMM"
              f" | {_f(c['engine_gflops'], 1)} / {_f(c['sgemm_1thread_gflops'], 1)}"
              f" = {_f(r['engine_flops_ratio'], 3)} |")
        fl = c["latency_floor_ms"]
        print(f"| no-queueing latency floor p50 / p99 (p99/p50) | {_f(fl['p50'])} / {_f(fl['p99'])} "
              f"({_f(fl['jitter'])}) |")
        ce = r["ceiling"]
        print(f"\nCeiling: {ce['cores']} cores / {_f(ce['per_slice_cpu_ms'], 3)} ms"
              f" = **{_f(ce['cpu_ceiling_per_s'], 1)}/s**; pipelined bound ({ce['workers']} preprocessing core(s))"
              f" = **{_f(ce['pipelined_bound_per_s'], 1)}/s**\n")
        if "cost_drift" in r:
            d = r["cost_drift"]
            print(f"Costs after the load / before: preprocessing {_f(d['preprocess'], 3)}, engine {_f(d['engine'], 3)};"
                  " the ceilings use the mean of the two phases.\n")


def _row(name: str, what: str, v: dict[str, Any]) -> None:
    lat = v["latency_ms"]
    mb = v.get("mean_batch") or (v.get("triton_batches") or {}).get("mean_batch")
    print(f"| {name} | {what} | {_f(v['throughput_per_s'], 1)} | {_f(lat['p50'], 1)} | {_f(lat['p99'], 1)}"
          f" | {_f(lat.get('jitter'))} | {_f(v.get('cpu_ms_per_request'), 1)} | {_f(v.get('server_cpu_cores'))}"
          f" | {_f(v.get('wakeups_per_request'), 1)} | {_f(v.get('page_faults_per_request'), 0)} | {_f(mb)} |")


def patterns(r: dict[str, Any]) -> None:
    sweep = r.get("sweep", {})
    if sweep:
        print("| server | clients | req/s | p50 ms | p99 ms | p99/p50 | CPU ms/req | CPU cores | wake-ups/req"
              " | page faults/req | mean batch |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, points in sweep.items():
            for n, v in sorted(points.items(), key=lambda kv: int(kv[0])):
                _row(name, n, v)
        for pattern in ("poisson", "poisson_own", "bursts"):
            pr = r.get(pattern)
            if not pr:
                continue
            what = (f"{pattern} {pr.get('rate_per_s')}/s" if "rate_per_s" in pr
                    else f"bursts {pr['size']} every {pr['period_s']} s")
            for name in ("appliance", "triton"):
                if pr.get(name):
                    _row(name, what, pr[name])


def peer_and_targets(r: dict[str, Any]) -> None:
    peer = r.get("peer")
    if peer:
        print(f"\nPeer: {peer.get('server')}; config {peer.get('config')}; inputs identical: "
              f"{peer.get('inputs', {}).get('identical')}; scores r = {peer['score_agreement'].get('r')} "
              f"(max |diff| {peer['score_agreement'].get('max_abs_diff')}, n = {peer['score_agreement'].get('n')})\n")
        print("| clients | throughput ratio | p99 ratio |\n|---|---|---|")
        for n in sorted(peer["throughput_ratio"], key=int):
            print(f"| {n} | {_f(peer['throughput_ratio'][n], 3)} | {_f(peer['p99_ratio'][n], 3)} |")
        tuning = peer.get("tuning", {}).get("trials", [])
        if tuning:
            print("\nTriton tuning (closed loop, saturated):\n")
            print("| instances | queue delay ms | req/s | p99 ms | CPU ms/req | mean batch |")
            print("|---|---|---|---|---|---|")
            for t in tuning:
                print(f"| {t['instances']} | {_f(t['queue_delay_ms'], 0)} | {_f(t['throughput_per_s'], 1)} | "
                      f"{_f(t.get('p99_ms'), 1)} | {_f(t.get('cpu_ms_per_request'), 1)} | {_f(t.get('mean_batch'))} |")
    if "self" in r:
        s = r["self"]
        print(f"\nSelf-comparison on {s['workload']}: overlap {s['overlap']['throughput_per_s']}/s vs sequential "
              f"{s['sequential']['throughput_per_s']}/s = **{s['speedup_vs_sequential']}x**")
        if "ideal_sequential_per_s" in s:
            print(f"against the arithmetic sequential baseline B / (B t_pre + t_engine)"
                  f" = {s['ideal_sequential_per_s']}/s:"
                  f" **{s['speedup_vs_ideal_sequential']}x**; pipelined bound {s['costs']['pipelined_bound_per_s']}/s,"
                  f" reached {s['pipelined_fraction']}")
    if "targets" in r:
        print("\n| target | value | goal | met |\n|---|---|---|---|")
        for name, t in r["targets"].items():
            met = {True: "met", False: "**not met**", None: "–"}[t["met"]]
            print(f"| {name} | {_f(t['value'], 3)} | {t['goal']} | {met} |")


def main(argv: list[str]) -> int:
    r = json.loads(Path(argv[1]).read_text())
    costs(r)
    patterns(r)
    peer_and_targets(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
