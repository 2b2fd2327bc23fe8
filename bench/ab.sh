#!/usr/bin/env bash
# A/B a code change: the working tree against a git ref, interleaved in ABBA order (new, base, base, new, new, ...)
# so the shared machine's drift hits both sides alike: a box that slows (or warms up) through the run favours
# whichever side runs first in every pair, and alternating which side leads cancels that to first order. Each run is `appliance bench --sweep 16` on the same workload; the base
# side runs from a temporary worktree of REF, started there: `python -m` puts the current directory first on
# sys.path, ahead of PYTHONPATH, so a base run started from this checkout would run this checkout's code.
# Prints one line per run and the mean of each side; differences smaller than the spread between pairs are noise.
# LOAD is a closed-loop client count (default 16) or poisson:RATE (open loop, Poisson arrivals at RATE per second).
# Usage: bench/ab.sh [REF] [PAIRS] [SECONDS] [WORKLOAD] [LOAD=16]   (from the checkout, with .venv holding the dev extra)
set -euo pipefail
ref="${1:-HEAD}"; pairs="${2:-3}"; secs="${3:-20}"; workload="${4:-quarters}"; load="${5:-16}"
case "$load" in
  poisson:*) pattern=(--poisson-rate "${load#poisson:}") ;;
  *) pattern=(--sweep "$load" --concurrency "$load") ;;
esac
bin="$(cd "${VENV:-.venv}/bin" && pwd)"
here="$(pwd)"
out="$(mktemp -d)"
git worktree add -q --detach "$out/base" "$ref"
trap 'git worktree remove --force "$out/base"; rm -rf "$out"' EXIT
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) = 1 ]; then order="new base"; else order="base new"; fi
  for side in $order; do
    if [ "$side" = base ]; then cd "$out/base"; else cd "$here"; fi
    code="$("$bin/python" -c 'import appliance, os; print(os.path.dirname(os.path.dirname(appliance.__file__)))')"
    [ "$code" = "$(pwd)" ] || { echo "$side would run the code in $code, not $(pwd)" >&2; exit 1; }
    "$bin/python" -m appliance.cli bench "${pattern[@]}" --workload "$workload" --no-sequential \
      --duration "$secs" --json "$out/$side-$i.json" >/dev/null 2>"$out/$side-$i.err"
  done
done
"$bin/python" - "$out" "$pairs" "$load" <<'PY'
import json, statistics, sys
out, pairs, load = sys.argv[1], int(sys.argv[2]), sys.argv[3]
keys = ("throughput_per_s", "cpu_ms_per_request", "wakeups_per_request", "page_faults_per_request")
rows = {"new": [], "base": []}
for i in range(1, pairs + 1):
    for side in rows:
        report = json.load(open(f"{out}/{side}-{i}.json"))
        if load.startswith("poisson:"):
            s = (report.get("poisson_own") or report["poisson"])["appliance"]
        else:
            s = report["sweep"]["appliance"][load]
        rows[side].append([s.get(k, 0) for k in keys] + [s["latency_ms"]["p50"], s["latency_ms"]["p99"]])
        print(f"{side:>4} {i}: " + "  ".join(f"{k} {v}" for k, v in zip((*keys, "p50_ms", "p99_ms"), rows[side][-1])))
for side, r in rows.items():
    print(f"{side:>4} mean: " + "  ".join(f"{k} {statistics.mean(col):.2f}"
                                          for k, col in zip((*keys, "p50_ms", "p99_ms"), zip(*r))))
PY
