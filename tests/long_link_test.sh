#!/usr/bin/env bash
# A long link, end to end: worker namespaces behind 1 Gbit/s paths with a
# 50 ms round trip to the shards (bench/overlap/netns.sh's ov_link, the
# documented host settings), whose self-check must pass (ping's RTT and
# iperf3's rate within 10 %). Then
#   1. 2 workers, 1 shard, 4M parameters: a warm round's exchange must reach
#      at least half the link (the share docs/performance.md reports);
#   2. 16 workers at once on the same paths with --stream_memory_bytes=32 MiB:
#      the shard's peak RSS must stay within docs/operations.md's memory
#      formula with no checkpoints (16 bytes per element of its range, 4 more
#      while an update is sent) plus that budget and 1 MiB per stream. Here
#      the shard keeps up with its streams, so this checks the formula at
#      N = 16, not the quota's pressure (fixed 128 MiB windows stay within
#      it too).
# Fails naming the figure; skips (77) only without root. Label long.
#   tests/long_link_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: network namespaces and netfilter queues need root"
  exit 77
fi
OV_PREFIX=co2lt
source "$here/bench/overlap/netns.sh"
OV_LINKEM=$build/bin/co2-linkem
scratch=$(mktemp -d /tmp/co2-long-link-XXXXXX)
OV_LINKEM_DIR=$scratch
trap 'ov_down; rm -rf "$scratch"' EXIT
ov_down
ov_up 16
ov_link 16 1gbit 50 0 tuned "$scratch/link.json" \
  || fail "the emulated link is not what was asked: $(cat "$scratch/link.json")"

hosts() {
  local i list=""
  for ((i = 0; i < $1; i++)); do list+="${list:+,}$(ov_worker_addr "$i")"; done
  echo "$list"
}
bench() {
  local name=$1 workers=$2
  shift 2
  "$build/bench/aggregator_bench" --aggregator="$build/bin/co2-aggregator" \
    --netns="$OV_PREFIX" --shard_host="$OV_AGG_ADDR" \
    --worker_hosts="$(hosts "$workers")" --workers="$workers" --shards=1 \
    --repetitions=1 --scratch="$scratch/$name" --out="$scratch/$name.json" \
    "$@" 2>"$scratch/$name.log" || { tail -5 "$scratch/$name.log"; fail "$name: aggregator_bench failed"; }
}

bench share 2 --params=4194304 --rounds=4 --idle_s=0.5 --iperf3= --gloo=false
python3 - "$scratch/share.json" <<'PY' || fail "a warm round's exchange reached less than half the link"
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
per_worker = run["payload_bytes_per_round"] / run["workers"] / 2
share = per_worker * 8 / 1e9 / run["aggregator"]["round_s_median"]
print(f"warm round {run['aggregator']['round_s_median']:.3f} s: {share:.2f} of 1 Gbit/s at 50 ms")
sys.exit(0 if share >= 0.5 else 1)
PY

budget=$((32 << 20))
bench memory 16 --params=4194304 --rounds=3 --iperf3= --gloo=false \
  --shard_flags=--stream_memory_bytes=$budget
python3 - "$scratch/memory.json" "$budget" <<'PY' || fail "the shard's memory outgrew its bound"
import json, sys
report, budget = json.load(open(sys.argv[1])), int(sys.argv[2])
run = report["runs"][0]
shard = run["shards"][0][0]  # repetition 0, shard 0
state = 20 * report["config"]["params"]
bound = shard["idle_rss_bytes"] + state + budget + run["streams"] * (1 << 20)
peak = shard["peak_rss_bytes"]
print(f"16 streams: shard peak {peak / 2**20:.1f} MiB, bound {bound / 2**20:.1f} MiB "
      f"(idle {shard['idle_rss_bytes'] / 2**20:.1f} + state {state / 2**20:.0f} + "
      f"budget {budget / 2**20:.0f} + 1 MiB per stream)")
sys.exit(0 if peak <= bound else 1)
PY
echo "PASS"
