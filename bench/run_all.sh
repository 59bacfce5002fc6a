#!/bin/bash
# Every benchmark of docs/performance.md, each kept short; results go to
# bench/results/. `make bench` runs this.
#   bench/run_all.sh [BUILD_DIR]     (default build; ~7–9 min on 2 busy cores,
#                                    and ~55 min more as root: the overlap,
#                                    the time to accuracy and the chaos run)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}

echo "== kernels (bench/results/kernels.json)"
"$here/run_kernels.sh" "$build"
echo "== aggregator (bench/results/aggregator.json)"
"$here/run_aggregator.sh" "$build"
echo "== bytes per sample (bench/results/bytes.json)"
"$here/run_bytes.sh" "$build"
# Overlap under shaped links (§1): network namespaces need root.
if [ "$(id -u)" = 0 ]; then
  echo "== aggregator over shaped links (bench/results/aggregator_links.json)"
  "$here/run_aggregator_links.sh" "$build"
  echo "== overlap (bench/results/overlap.json; ~25 min)"
  "$here/run_overlap.sh" "$build"
  echo "== time to accuracy (bench/results/time_to_accuracy.json; ~3 min)"
  "$here/run_time_to_accuracy.sh" "$build"
  echo "== goodput under chaos (bench/results/chaos.json; ~30 min)"
  "$here/chaos/run.sh" "$build"
else
  echo "== aggregator over links, overlap, time to accuracy and chaos skipped:" \
    "they need root (sudo bench/run_aggregator_links.sh $build;" \
    "sudo bench/run_overlap.sh $build; sudo bench/run_time_to_accuracy.sh $build;" \
    "sudo bench/chaos/run.sh $build)"
fi
