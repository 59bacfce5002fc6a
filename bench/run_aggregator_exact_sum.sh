#!/bin/bash
# What the exact, order-independent sums and the anchor digests
# (docs/algorithm.md) cost the shards: their CPU per round on loopback, with
# this tree's co2-aggregator and with the same binary built from BASE (the
# commit before server/exact_sum.cc existed: fp32 sums in arrival order, no
# digests), in one invocation, runs alternating between the two. The workers
# are this tree's aggregator_bench clients in both. Writes
# bench/results/aggregator_exact_sum.json with the ratios.
#   bench/run_aggregator_exact_sum.sh [BUILD_DIR]
#   BASE=<commit> WORKERS=2,4 PARAMS=4194304 SHARDS=2 ROUNDS=8 PAIRS=3 \
#     bench/run_aggregator_exact_sum.sh build
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=$(cd "${1:-build}" && pwd)
out=${OUT:-$here/results/aggregator_exact_sum.json}
base=${BASE:-$(git -C "$repo" log -n1 --format=%H --diff-filter=A -- \
  server/exact_sum.cc)^}
base=$(git -C "$repo" rev-parse "$base")
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
before="$scratch/src/build/bin/co2-aggregator"
after="$build/bin/co2-aggregator"

pairs=${PAIRS:-3}
for ((i = 0; i < pairs; ++i)); do
  for which in before after; do
    binary=$before
    [ "$which" = after ] && binary=$after
    "$build/bench/aggregator_bench" --aggregator="$binary" --iperf3= \
      --gloo=false --workers="${WORKERS:-2,4}" \
      --params="${PARAMS:-4194304}" --shards="${SHARDS:-2}" \
      --rounds="${ROUNDS:-8}" --repetitions=1 \
      --scratch="$scratch/$which-$i" --out="$scratch/$which-$i.json"
  done
done

python3 - "$scratch" "$pairs" "$out" "$base" <<'PY'
import json, statistics, sys
scratch, pairs, out, base = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
shards, rounds_s = {}, {}
machine = config = None
for which in ("before", "after"):
    for i in range(pairs):
        report = json.load(open(f"{scratch}/{which}-{i}.json"))
        machine, config = report["machine"], report.get("config")
        for run in report["runs"]:
            n = run["workers"]
            shards.setdefault((which, n), []).append(
                run["cpu_s_per_round"]["shards"]["total"])
results = []
for n in sorted({n for _, n in shards}):
    b = statistics.median(shards[("before", n)])
    a = statistics.median(shards[("after", n)])
    results.append({
        "workers": n,
        "shards_cpu_s_per_round_before": round(b, 5),
        "shards_cpu_s_per_round_after": round(a, 5),
        "before_each": [round(x, 5) for x in shards[("before", n)]],
        "after_each": [round(x, 5) for x in shards[("after", n)]],
        "after_over_before": round(a / b, 3),
        "meets_target": a / b <= 1.10,
    })
report = {
    "what": "the shards' CPU time per round (user + system, all shards, "
            "medians over alternating runs) with exact order-independent "
            "sums and anchor digests (after) and with the co2-aggregator "
            "built from the commit before them (before); target: "
            "after_over_before <= 1.10",
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
    print(f"N={r['workers']}: shards CPU/round {r['shards_cpu_s_per_round_before']:.4f} s "
          f"-> {r['shards_cpu_s_per_round_after']:.4f} s, x{r['after_over_before']:.3f}")
print(f"wrote {out}")
PY
