#!/usr/bin/env bash
# Design experiments behind the recommendations in docs/performance.md, configuration only (no code change):
# the same measurement (costs, closed loop at 1 and 16 clients, Poisson at 0.7 x the default's capacity) with
#   - the default batcher (max_wait 5 ms),
#   - max_wait 0 (launch the moment the engine is idle: what the wait costs a single client),
#   - max_wait 40 ms (wait for fuller batches: what partial batches cost in CPU per request),
#   - 1 and 3 preprocessing workers instead of the auto 2, and workers at niceness 0 instead of 5,
#   - the FP32 artifact instead of INT4.
# Usage: bench/experiments.sh [OUTDIR] [SECONDS]    (run from the checkout, with .venv holding the dev extra)
set -euo pipefail
out="${1:-out/experiments}"; secs="${2:-12}"
bin="${VENV:-.venv}/bin"
mkdir -p "$out"
conf() { printf '%b\n' "$1" > "$out/$2.toml"; echo "$out/$2.toml"; }
run() {
  local name="$1"; shift
  "$bin/appliance" bench --workload quarters --costs --sweep 1,16 --concurrency 16 $poisson \
    --duration "$secs" --no-sequential --logs "$out/logs-$name" --json "$out/$name.json" -- "$@" \
    >/dev/null 2>"$out/$name.err" || true
  "$bin/python" - "$out/$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = r["sweep"]["appliance"]; p = r["poisson"]["appliance"]
print(f"{sys.argv[2]:>14}: 1 client p50 {s['1']['latency_ms']['p50']:6.1f} ms | 16 clients {s['16']['throughput_per_s']:6.1f}/s "
      f"mean batch {s['16'].get('mean_batch')} cpu {s['16'].get('cpu_ms_per_request')} ms/req | Poisson {p['throughput_per_s']:.1f}/s "
      f"p50 {p['latency_ms']['p50']:.1f} p99 {p['latency_ms']['p99']:.1f} jitter {p['latency_ms']['jitter']} "
      f"mean batch {p.get('mean_batch')} cpu {p.get('cpu_ms_per_request')} | ceiling {r['ceiling']['cpu_ceiling_per_s']}/s")
PY
}
poisson="--poisson 0.7"
run default
# the same offered load for every variant: 0.7 x the default configuration's capacity
poisson="--poisson-rate $("$bin/python" -c "import json; print(json.load(open('$out/default.json'))['poisson']['rate_per_s'])")"
run wait0 --config "$(conf '[batcher]\nmax_wait_s = 0.0' wait0)"
run wait40 --config "$(conf '[batcher]\nmax_wait_s = 0.04' wait40)"
run workers1 --config "$(conf '[batcher]\npreprocess_workers = 1' workers1)"
run workers3 --config "$(conf '[batcher]\npreprocess_workers = 3' workers3)"
run nice0 --config "$(conf '[workers]\nnice = 0' nice0)"
run fp32 --precision fp32
