#!/usr/bin/env bash
# Load test (docs/performance.md §5): 64 simulated workers x 2 shards x 50
# rounds, 1M parameters, loopback. Writes bench/results/load.json.
# Usage: bench/run_load.sh [build-dir]
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
out=bench/results/load.json
tmp=$(mktemp)
CO2_LOAD_REPORT="$tmp" "$build/tests/load_test"
machine=$(printf '{"cpu": "%s", "cores": %s, "memory_kib": %s, "kernel": "%s"}' \
  "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(nproc)" \
  "$(awk '/MemTotal/{print $2}' /proc/meminfo)" "$(uname -r)")
python3 - "$tmp" "$out" "$machine" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
result["machine"] = json.loads(sys.argv[3])
result["command"] = "bench/run_load.sh"
json.dump(result, open(sys.argv[2], "w"), indent=2)
PY
rm -f "$tmp"
cat "$out"
