#!/bin/bash
# What the anchor digests and the exact, order-independent sums
# (docs/algorithm.md) cost the shards: their CPU per round on loopback with
# the co2-aggregator built from BASE (no digests, fp32 sums: "before"), with
# this tree's ("after": digests, fp32 sums, the default) and with this
# tree's in a `deterministic` job ("exact": digests and exact sums), in one
# invocation, runs alternating in a rotating order. The workers are this
# tree's aggregator_bench clients throughout. 16 rounds, so that the rounds
# timed are mostly ones whose sums are already allocated, as in a job's
# steady state. Writes bench/results/aggregator_exact_sum.json.
#   bench/run_aggregator_exact_sum.sh [BUILD_DIR]
#   BASE=<commit> WORKERS=2,4 PARAMS=4194304 SHARDS=2 ROUNDS=16 PAIRS=6 \
#     bench/run_aggregator_exact_sum.sh build
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=$(cd "${1:-build}" && pwd)
out=${OUT:-$here/results/aggregator_exact_sum.json}
# The last commit without digests or exact sums.
base=$(git -C "$repo" rev-parse "${BASE:-1d8b914}")
scratch=$(mktemp -d /tmp/co2-exact-sum-bench-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# The baseline co2-aggregator (ccache serves what other checkouts built).
mkdir -p "$scratch/src"
git -C "$repo" archive "$base" | tar -x -C "$scratch/src"
export CCACHE_BASEDIR="$scratch/src" CCACHE_NOHASHDIR=1
cmake -S "$scratch/src" -B "$scratch/src/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCO2_WITH_TORCH=OFF \
  -DCO2_BUILD_TESTS=OFF -DCO2_BUILD_BENCH=OFF >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log" >&2; exit 1; }
cmake --build "$scratch/src/build" --target co2-aggregator -j "${JOBS:-2}" \
  >"$scratch/build.log" 2>&1 || { tail -50 "$scratch/build.log" >&2; exit 1; }

pairs=${PAIRS:-6}
kinds=(before after exact)
for ((i = 0; i < pairs; ++i)); do
  # Each pair starts with the next kind, so that a machine that slows down
  # (or speeds up) during the invocation weighs on every kind alike.
  for ((k = 0; k < 3; ++k)); do
    which=${kinds[(i + k) % 3]}
    binary=$build/bin/co2-aggregator
    [ "$which" = before ] && binary=$scratch/src/build/bin/co2-aggregator
    deterministic=false
    [ "$which" = exact ] && deterministic=true
    "$build/bench/aggregator_bench" --aggregator="$binary" --iperf3= \
      --gloo=false --workers="${WORKERS:-2,4}" \
      --params="${PARAMS:-4194304}" --shards="${SHARDS:-2}" \
      --rounds="${ROUNDS:-16}" --repetitions=1 \
      --deterministic="$deterministic" \
      --scratch="$scratch/$which-$i" --out="$scratch/$which-$i.json"
  done
done

/usr/bin/python3 - "$scratch" "$pairs" "$out" "$base" <<'PY'
import json, statistics, sys
scratch, pairs, out, base = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
kinds = ("before", "after", "exact")
shards, memory = {}, {}
machine = config = None
for which in kinds:
    for i in range(pairs):
        report = json.load(open(f"{scratch}/{which}-{i}.json"))
        machine, config = report["machine"], report.get("config")
        for run in report["runs"]:
            shards.setdefault((which, run["workers"]), []).append(
                run["cpu_s_per_round"]["shards"]["total"])
            for rep in run["shards"]:
                memory.setdefault((which, run["workers"]), []).extend(
                    s["peak_minus_idle_over_range"] for s in rep)
results = []
for n in sorted({n for _, n in shards}):
    med = {k: statistics.median(shards[(k, n)]) for k in kinds}
    results.append({
        "workers": n,
        **{f"shards_cpu_s_per_round_{k}": round(med[k], 5) for k in kinds},
        **{f"{k}_each": [round(x, 5) for x in shards[(k, n)]] for k in kinds},
        "after_over_before": round(med["after"] / med["before"], 3),
        "exact_over_before": round(med["exact"] / med["before"], 3),
        **{f"shard_peak_minus_idle_over_range_{k}":
           round(statistics.median(memory[(k, n)]), 2) for k in kinds},
    })
config.pop("deterministic", None)
report = {
    "what": "the shards' CPU time per round (user + system, all shards, "
            "medians over alternating runs): before = the co2-aggregator of "
            "base_commit (fp32 sums, no anchor digests); after = this tree "
            "(anchor digests, fp32 sums: the default); exact = this tree in a "
            "deterministic job (anchor digests, exact sums); target: at most "
            "1.10 x before. shard_peak_minus_idle_over_range: each shard's "
            "peak RSS less its idle RSS over its fp32 range (no checkpoints), "
            "median over shards and runs",
    "base_commit": base,
    "machine": machine,
    "config": config,
    "pairs": pairs,
    "results": results,
}
with open(out, "w") as f:
    json.dump(report, f, indent=1)
    f.write("\n")
for r in results:
    print(f"N={r['workers']}: shards CPU/round before {r['shards_cpu_s_per_round_before']:.4f} s, "
          f"after x{r['after_over_before']:.3f}, exact x{r['exact_over_before']:.3f}; "
          f"shard memory over range {r['shard_peak_minus_idle_over_range_before']}, "
          f"{r['shard_peak_minus_idle_over_range_after']}, "
          f"{r['shard_peak_minus_idle_over_range_exact']}")
print(f"wrote {out}")
PY
