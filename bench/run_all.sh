#!/bin/bash
# Every benchmark of docs/performance.md, each kept short; results go to
# bench/results/. `make bench` runs this.
#   bench/run_all.sh [BUILD_DIR]     (default build; ~7–9 min on 2 busy cores)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}

echo "== kernels (bench/results/kernels.json)"
"$here/run_kernels.sh" "$build"
echo "== aggregator (bench/results/aggregator.json)"
"$here/run_aggregator.sh" "$build"
echo "== bytes per sample (bench/results/bytes.json)"
"$here/run_bytes.sh" "$build"
# Overlap under shaped links (issue 6, part 1), once it exists.
if [ -x "$here/run_overlap.sh" ]; then
  echo "== overlap"
  "$here/run_overlap.sh" "$build"
fi
