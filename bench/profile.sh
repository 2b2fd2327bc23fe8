#!/usr/bin/env bash
# Profile the daemon under the bench load with py-spy (docs/performance.md).
#
#   bench/profile.sh [SECONDS] [WORKLOAD] [CONCURRENCY] [OUTDIR]
#
# Starts `appliance serve` on a free loopback port, drives it with `appliance bench --target` (closed loop), and
# records the daemon and its worker processes with `py-spy record --subprocesses` (raw collapsed stacks, plus a
# flame graph SVG), then prints where the CPU samples went (bench/profile_summary.py). Run from the checkout
# whose daemon you want to profile, with its venv (.venv) holding the dev extra (py-spy).
set -euo pipefail
secs="${1:-15}"; workload="${2:-quarters}"; conc="${3:-16}"; out="${4:-out/profile}"
bin="${VENV:-.venv}/bin"
mkdir -p "$out"
port=$("$bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/appliance" serve --listen "127.0.0.1:$port" >"$out/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  "$bin/appliance" health --target "127.0.0.1:$port" >/dev/null 2>&1 && break
  sleep 0.2
done
"$bin/appliance" bench --target "127.0.0.1:$port" --target-pid "$daemon" --workload "$workload" \
  --concurrency "$conc" --sweep "$conc" --duration "$((secs + 8))" --json "$out/bench.json" >/dev/null 2>"$out/bench.log" &
load=$!
sleep 5  # warm-up and a steady batch rhythm before sampling
here="$(dirname "$0")"
"$bin/python" "$here/thread_cpu.py" snapshot "$daemon" "$out/threads-before.json"
t0=$(date +%s.%N)
"$bin/py-spy" record --pid "$daemon" --subprocesses --nonblocking --threads --rate 100 --duration "$secs" \
  --format raw -o "$out/daemon.txt" >/dev/null 2>"$out/py-spy.log"
t1=$(date +%s.%N)
"$bin/python" "$here/thread_cpu.py" snapshot "$daemon" "$out/threads-after.json"
wait $load || true
window=$(python3 -c "print($t1 - $t0)")
requests=$("$bin/python" -c "import json; print(json.load(open('$out/bench.json'))['throughput_per_s'] * $window)")
{
  echo "== real CPU by thread (kernel counters) over ${window} s"
  "$bin/python" "$here/thread_cpu.py" diff "$out/threads-before.json" "$out/threads-after.json" "$requests"
  echo
  echo "== py-spy samples (runnable time: on a busy machine this includes waiting for a core)"
  "$bin/python" "$here/profile_summary.py" "$out/daemon.txt" 100 "$window" "$out/bench.json"
} | tee "$out/summary.txt"
